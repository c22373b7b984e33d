"""KV topologies (ADR-8 "Multi-Cluster and Leafnode topologies"): mirrors and aggregates.

A *mirror* is a stream of its own name (never ``KV_...``: it is not a bucket) that mirrors
``KV_<bucket>``, optionally only some keys. A mirror of every key has ``mirror_direct``: the
server then lets it answer the bucket's Direct Gets (it joins their queue group), so it keeps
what the bucket keeps (its history and ttl default to the bucket's; a longer ttl would answer
keys the bucket expired, and is refused). A mirror of some keys would answer "not found" for
the others, so it must not: it is a copy read by its own name only. nats-server makes every
mirror of a stream it sees mirror_direct when that stream allows Direct Get, which a bucket's
must (server/stream.go checkStreamCfg, whatever the config asks), so a mirror of some keys is
made of an ``external`` bucket only. A mirror denies deletes and purges (except on servers
before 2.14, which would refuse to copy an origin's purges into it: :meth:`Topologies.copying`).
Its origin must have ``allow_direct`` (ADR-8).

An *aggregate* is a bucket whose stream sources other buckets (the stream config is made in
:func:`app.kv.model.stream_config`): each origin's ``$KV.<origin>.<filter>`` is transformed
to ``$KV.<aggregate>.<filter>``, so keys keep their names, as nats.go's KV sources do. A
read-only one has no subjects: a write to it finds no stream, and is answered 409
``kv.read_only`` (:class:`ReadOnlyBuckets` remembers it for a few seconds, so that the next
writes are refused without being sent).

Only streams that are a mirror of the bucket in the path are ever changed or deleted here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from app import errors, validation
from app.durations import nats_time, ns_to_seconds
from app.errors import ErrorCode
from app.kv import model as kv_model
from app.kv.model import bucket_errors, source_identity, status_from_info, stream_name
from app.kv.schemas import KVMirrorConfig, KVOrigin
from app.nats import features
from app.nats.direct import DirectGet
from app.nats.jsapi import JetStreamApi
from app.streams.service import create_or_update, every_stream

log = logging.getLogger("jsgw.kv")

# How long a bucket found read-only is refused writes without asking the server again (its
# config may be changed by other means than the gateway).
_READ_ONLY_TTL = 5.0
_READ_ONLY_MAX = 10_000


class ReadOnlyBuckets:
    """The buckets known to be read-only aggregates, each until a deadline."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __contains__(self, bucket: str) -> bool:
        until = self._until.get(bucket)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._until[bucket]
        return False

    def mark(self, bucket: str, read_only: bool) -> None:
        if not read_only:
            self._until.pop(bucket, None)
            return
        if len(self._until) >= _READ_ONLY_MAX:
            self._until.clear()
        self._until[bucket] = time.monotonic() + _READ_ONLY_TTL


def read_only_error(bucket: str) -> errors.Conflict:
    return errors.Conflict(
        ErrorCode.KV_READ_ONLY,
        f"bucket {bucket!r} is a read-only aggregate: its values come from its origins only",
    )


def mirror_name(name: str) -> str:
    validation.stream_name(name)
    if name.startswith(kv_model.STREAM_PREFIX):
        # ADR-8: a mirror is not a bucket, and a KV_ name would make it look like one.
        raise errors.InvalidInput(
            ErrorCode.STREAM_NAME_INVALID,
            f"a mirror's name does not start with {kv_model.STREAM_PREFIX!r} (ADR-8): it is "
            "not a bucket",
        )
    return name


def mirror_config(
    bucket: str, name: str, config: KVMirrorConfig, origin: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The stream of a mirror of ``bucket`` (ADR-8 Creation of Mirrors); ``origin``: the
    bucket's stream config (None for an external one), whose history and ttl are the
    defaults."""
    mirror: dict[str, Any] = {"name": stream_name(bucket)}
    keys = config.keys or [">"]
    if len(keys) == 1:
        mirror["filter_subject"] = kv_model.filter_subject(bucket, keys[0])
    else:
        subjects = [kv_model.filter_subject(bucket, key_filter) for key_filter in keys]
        mirror["subject_transforms"] = [{"src": s, "dest": s} for s in subjects]
    if config.external is not None:
        mirror["external"] = config.external.model_dump(exclude_none=True)
    body: dict[str, Any] = {
        "name": name,
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": _default(config.history, origin, "max_msgs_per_subject", 1),
        "max_msgs": -1,
        "max_bytes": config.max_bytes,
        "max_age": _default(config.ttl, origin, "max_age", 0),
        "storage": config.storage,
        "num_replicas": config.replicas,
        "deny_delete": True,
        "deny_purge": True,
        "allow_direct": True,
        # Only a mirror of every key may answer the bucket's reads (see the module docstring).
        "mirror_direct": _every_key(config),
        "mirror": mirror,
    }
    if config.description is not None:
        body["description"] = config.description
    if config.placement is not None:
        body["placement"] = config.placement.model_dump(exclude_none=True)
    return body


def _every_key(config: KVMirrorConfig) -> bool:
    return not config.keys or config.keys == [">"]


def _default(given: int | None, origin: dict[str, Any] | None, field: str, fallback: int) -> int:
    if given is not None:
        return given
    return int((origin or {}).get(field) or fallback)


def check_outlives(bucket: str, body: dict[str, Any], origin: dict[str, Any]) -> None:
    """409 kv.mirror_outlives_bucket: a mirror that answers the bucket's reads keeps no value
    longer than the bucket does (it would answer keys the bucket has expired)."""
    bucket_ttl, ttl = int(origin.get("max_age") or 0), int(body.get("max_age") or 0)
    if body.get("mirror_direct") and bucket_ttl and not 0 < ttl <= bucket_ttl:
        raise errors.Conflict(
            ErrorCode.KV_MIRROR_OUTLIVES_BUCKET,
            f"a mirror of every key of bucket {bucket!r} answers its reads, so its ttl is at "
            f"most the bucket's ({ns_to_seconds(bucket_ttl)} s): leave ttl out to take it",
        )


def _mirrored(mirror: dict[str, Any]) -> tuple[Any, ...]:
    """What a mirror copies, as comparable values (the server fills in defaults)."""
    transforms = [(t.get("src"), t.get("dest")) for t in mirror.get("subject_transforms") or []]
    external = mirror.get("external") or {}
    return (
        mirror.get("name"),
        mirror.get("filter_subject") or None,
        transforms,
        external.get("api"),
        external.get("deliver") or None,
    )


def mirrors_bucket(config: dict[str, Any], bucket: str) -> bool:
    return ((config.get("mirror") or {}).get("name")) == stream_name(bucket)


def _mirror_keys(bucket: str, mirror: dict[str, Any]) -> list[str] | None:
    prefix = kv_model.key_prefix(bucket)
    filters = [str(t.get("src", "")) for t in mirror.get("subject_transforms") or []]
    if mirror.get("filter_subject"):
        filters.append(str(mirror["filter_subject"]))
    keys = [f[len(prefix) :] for f in filters if f.startswith(prefix)]
    return None if not keys or keys == [">"] else keys


def mirror_view(bucket: str, info: dict[str, Any]) -> dict[str, Any]:
    """A mirror as the listing shows it: its keys, and the lag the server reports."""
    config, state = info.get("config") or {}, info.get("state") or {}
    mirror = config.get("mirror") or {}
    source = info.get("mirror") or {}
    out: dict[str, Any] = {
        "name": config.get("name", ""),
        "bucket": bucket,
        "keys": _mirror_keys(bucket, mirror),
        "values": state.get("messages", 0),
        "last_revision": state.get("last_seq", 0),
        "storage": config.get("storage", "file"),
        "replicas": config.get("num_replicas", 1),
        "history": config.get("max_msgs_per_subject", 1),
        "ttl": ns_to_seconds(int(config.get("max_age") or 0)),
        "direct": bool(config.get("mirror_direct")),
        "created": nats_time(info.get("created")),
        "lag": source.get("lag"),
    }
    active = source.get("active")
    if isinstance(active, int) and active >= 0:
        out["active"] = ns_to_seconds(active)
    if mirror.get("external"):
        out["external"] = mirror["external"]
    if source.get("error"):
        out["error"] = source["error"]
    return {k: v for k, v in out.items() if v is not None}


@contextlib.contextmanager
def _mirror_errors(bucket: str, name: str) -> Iterator[None]:
    try:
        yield
    except errors.StreamNotFound:
        raise _no_mirror(bucket, name) from None


def _no_mirror(bucket: str, name: str) -> errors.NotFound:
    return errors.NotFound(
        ErrorCode.KV_MIRROR_NOT_FOUND, f"bucket {bucket!r} has no mirror named {name!r}"
    )


class Topologies:
    def __init__(self, js: JetStreamApi, direct: DirectGet, read_only: ReadOnlyBuckets) -> None:
        self.js = js
        self.direct = direct
        self.read_only = read_only

    async def _stream_config(self, stream: str) -> dict[str, Any] | None:
        with contextlib.suppress(errors.StreamNotFound):
            info = await self.js.call("stream.info", "STREAM", "INFO", stream)
            config: dict[str, Any] = info.get("config") or {}
            return config
        return None

    # -- mirrors -------------------------------------------------------------------------------

    async def put_mirror(
        self, bucket: str, name: str, config: KVMirrorConfig
    ) -> tuple[dict[str, Any], bool]:
        """Create (True) or update (False) mirror ``name`` of ``bucket``."""
        validation.bucket_name(bucket)
        mirror_name(name)
        origin: dict[str, Any] | None = None
        if not _every_key(config) and config.external is None:
            raise errors.Conflict(
                ErrorCode.KV_MIRROR_KEYS_LOCAL,
                "nats-server makes a mirror of a bucket it holds answer the bucket's reads, "
                "which one of some keys only cannot: mirror every key, or an external bucket",
            )
        if config.external is None:
            with bucket_errors(bucket):
                info = await self.js.call("stream.info", "STREAM", "INFO", stream_name(bucket))
            origin = info.get("config") or {}
            if not origin.get("allow_direct"):
                raise errors.Conflict(
                    ErrorCode.KV_DIRECT_REQUIRED,
                    f"bucket {bucket!r} does not allow Direct Get, which its mirrors answer "
                    "(ADR-8): update the bucket (PUT /v1/kv/{bucket} sets allow_direct) first",
                )
        existing = await self._stream_config(name)
        if existing is not None and not mirrors_bucket(existing, bucket):
            raise errors.Conflict(
                ErrorCode.KV_NOT_A_MIRROR,
                f"stream {name!r} exists and is not a mirror of bucket {bucket!r}: left alone",
            )
        body = self.copying(mirror_config(bucket, name, config, origin), existing)
        if origin is not None:
            check_outlives(bucket, body, origin)
        if existing is not None and _mirrored(existing["mirror"]) != _mirrored(body["mirror"]):
            raise errors.Conflict(
                ErrorCode.STREAM_NOT_UPDATABLE,
                f"what mirror {name!r} copies (its keys, its external) cannot change (the "
                "server keeps a mirror's source as made): delete it and make it again",
            )
        info, created = await create_or_update(self.js, self.direct, name, body, existing=existing)
        return mirror_view(bucket, info), created

    def copying(self, body: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
        """``body``, the config of a stream that copies a bucket, as the connected server
        stores the roll-ups it copies (:func:`app.kv.model.taking_copied_rollups`)."""
        version = self.js.pool.server_info().get("version")
        if not features.refuses_copied_rollups(version):
            return body
        if existing is not None and existing.get("deny_purge"):
            log.warning(
                "stream %s denies purges: nats-server %s stops copying into it at its origin's "
                "first purge, and the server never turns deny_purge off; delete it and make it "
                "again through the gateway",
                body["name"],
                version,
            )
        return kv_model.taking_copied_rollups(body, existing)

    async def mirrors(
        self, bucket: str, visible: Callable[[str], bool] | None = None
    ) -> list[dict[str, Any]]:
        """The mirrors of ``bucket`` (every stream whose mirror is ``KV_<bucket>``), those
        ``visible`` admits by name."""
        validation.bucket_name(bucket)
        with bucket_errors(bucket):
            await self.js.call("stream.info", "STREAM", "INFO", stream_name(bucket))
        found = [
            mirror_view(bucket, info)
            async for info in every_stream(self.js)
            if mirrors_bucket(info.get("config") or {}, bucket)
            and (visible is None or visible(str(info["config"].get("name", ""))))
        ]
        return sorted(found, key=lambda m: str(m["name"]))

    async def delete_mirror(self, bucket: str, name: str) -> None:
        validation.bucket_name(bucket)
        mirror_name(name)
        existing = await self._stream_config(name)
        if existing is None or not mirrors_bucket(existing, bucket):
            raise _no_mirror(bucket, name)
        with _mirror_errors(bucket, name):
            await self.js.call("stream.delete", "STREAM", "DELETE", name, write=True)
        self.direct.forget(name)

    # -- aggregates ----------------------------------------------------------------------------

    async def check_origins(self, bucket: str, origins: list[KVOrigin]) -> None:
        """Each origin is another bucket's stream that exists (external ones are not
        looked up: they are elsewhere), named once."""
        seen: set[tuple[str, str | None]] = set()
        for origin in origins:
            identity = source_identity(kv_model.origin_source(bucket, origin))
            if identity in seen:
                raise errors.Conflict(
                    ErrorCode.KV_ORIGIN_EXISTS,
                    f"origin {identity[0]!r} is named twice: give all its keys in one origin",
                )
            seen.add(identity)
            if origin.external is not None:
                continue
            if bucket in (origin.bucket, kv_model.bucket_of_stream(identity[0])):
                raise errors.InvalidInput(
                    ErrorCode.REQUEST_INVALID, "an aggregate cannot be its own origin"
                )
            if await self._stream_config(identity[0]) is None:
                raise errors.NotFound(
                    ErrorCode.KV_BUCKET_NOT_FOUND,
                    f"origin {identity[0]!r} (of bucket {origin.bucket!r}) does not exist",
                )

    async def add_origin(self, bucket: str, origin: KVOrigin) -> dict[str, Any]:
        """Add an origin to aggregate ``bucket``; 409 kv.origin_exists when it has it."""
        validation.bucket_name(bucket)
        stream = stream_name(bucket)
        with bucket_errors(bucket):
            info = await self.js.call("stream.info", "STREAM", "INFO", stream)
        config: dict[str, Any] = dict(info.get("config") or {})
        sources = list(config.get("sources") or [])
        if not sources:
            raise errors.Conflict(
                ErrorCode.KV_NOT_AGGREGATE, f"bucket {bucket!r} is not an aggregate"
            )
        await self.check_origins(bucket, [origin])
        source = kv_model.origin_source(bucket, origin)
        if source_identity(source) in {source_identity(s) for s in sources}:
            raise errors.Conflict(
                ErrorCode.KV_ORIGIN_EXISTS,
                f"aggregate {bucket!r} already has origin {source['name']!r}",
            )
        existing = config
        config = self.copying({**existing, "sources": [*sources, source]}, existing)
        updated, _ = await create_or_update(self.js, self.direct, stream, config, existing=existing)
        self.read_only.mark(bucket, kv_model.is_read_only(config))
        return status_from_info(updated)
