"""KV bucket administration: the stream behind a bucket is always the one ADR-8 prescribes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from app import errors, validation
from app.errors import ErrorCode
from app.kv import model as kv_model
from app.kv.model import bucket_errors, is_read_only, status_from_info, stream_name
from app.kv.schemas import KVConfig
from app.kv.topology import ReadOnlyBuckets, Topologies
from app.nats import features
from app.nats.direct import DirectGet
from app.nats.jsapi import JetStreamApi
from app.streams.service import create_or_update, every_stream


def is_bucket(bucket: str, config: dict[str, Any]) -> bool:
    """Whether stream ``KV_<bucket>`` is a bucket: on ``$KV.<bucket>.>``, or a read-only
    aggregate (which has no subjects)."""
    return config.get("subjects") == [f"$KV.{bucket}.>"] or is_read_only(config)


class Buckets:
    def __init__(self, js: JetStreamApi, direct: DirectGet, read_only: ReadOnlyBuckets) -> None:
        self.js = js
        self.direct = direct
        self.read_only = read_only
        self.topologies = Topologies(js, direct, read_only)

    async def list_all(self, visible: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        """Every bucket (a ``KV_`` stream on ``$KV.<bucket>.>``, or a read-only aggregate) with
        its status."""
        buckets: list[dict[str, Any]] = []
        # Every stream: a read-only aggregate has no subjects to be found by.
        async for info in every_stream(self.js):
            config = info.get("config") or {}
            bucket = kv_model.bucket_of_stream(str(config.get("name", "")))
            if bucket and is_bucket(bucket, config) and (visible is None or visible(bucket)):
                buckets.append(status_from_info(info))
        return buckets

    async def _info(self, bucket: str) -> dict[str, Any]:
        validation.bucket_name(bucket)
        with bucket_errors(bucket):
            return await self.js.call("stream.info", "STREAM", "INFO", stream_name(bucket))

    async def status(self, bucket: str) -> dict[str, Any]:
        return status_from_info(await self._info(bucket))

    async def put(self, bucket: str, config: KVConfig) -> tuple[dict[str, Any], bool]:
        """Create (True) or update (False) a bucket; the stream config is ADR-8's, always."""
        validation.bucket_name(bucket)
        stream = stream_name(bucket)
        existing: dict[str, Any] | None = None
        with contextlib.suppress(errors.NotFound):
            existing = (await self.js.call("stream.info", "STREAM", "INFO", stream)).get("config")
        if existing is not None:
            self._check_update(bucket, existing, config)
        if config.aggregate is not None:
            await self.topologies.check_origins(bucket, config.aggregate.origins)
        body = kv_model.stream_config(bucket, config, existing)
        if body.get("sources"):
            body = self.topologies.copying(body, existing)
        self.js.pool.require(*features.of_stream(body))
        info, created = await create_or_update(
            self.js, self.direct, stream, body, existing=existing
        )
        self.read_only.mark(bucket, is_read_only(body))
        return status_from_info(info), created

    @staticmethod
    def _check_update(bucket: str, existing: dict[str, Any], config: KVConfig) -> None:
        if not is_bucket(bucket, existing):
            raise errors.Conflict(
                ErrorCode.KV_NOT_A_BUCKET,
                f"stream {stream_name(bucket)!r} exists but is not a KV bucket "
                f"(its subjects are not $KV.{bucket}.>)",
            )
        if existing.get("subject_delete_marker_ttl") and not config.limit_marker_ttl:
            raise errors.Conflict(
                ErrorCode.KV_LIMIT_MARKERS_LOCKED,
                "limit markers cannot be turned off once on (ADR-48): give limit_marker_ttl again",
            )

    async def delete(self, bucket: str) -> None:
        validation.bucket_name(bucket)
        stream = stream_name(bucket)
        with bucket_errors(bucket):
            await self.js.call("stream.delete", "STREAM", "DELETE", stream, write=True)
        self.direct.forget(stream)
        self.read_only.mark(bucket, False)
