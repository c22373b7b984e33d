"""A one-off scan of a stream through an ephemeral pull consumer, read in bounded batches.

Used where ADR-8 reads "with an ephemeral consumer": key listings (headers only) and the
history of a bucket without Direct Get. A pull consumer lets the gateway ask for exactly as
many messages as a page needs; the consumer is deleted as soon as the scan is over, and has a
short ``inactive_threshold`` in case the gateway dies first.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nats.aio.msg import Msg

from app import errors
from app.durations import NS_PER_SECOND
from app.errors import ErrorCode
from app.nats.acks import parse_ack_subject
from app.nats.jsapi import JetStreamApi
from app.nats.pull import PullRequest, fetch
from app.tasks import run_to_end

_INACTIVE_THRESHOLD_NS = 30 * NS_PER_SECOND


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivered message, with the consumer metadata from its ack subject."""

    subject: str
    stream_seq: int
    consumer_seq: int
    pending: int
    timestamp_ns: int
    headers: dict[str, str] | None
    data: bytes


def delivery(msg: Msg) -> Delivery:
    meta = parse_ack_subject(msg.reply)
    if meta is None:
        raise errors.UpstreamError(
            ErrorCode.JETSTREAM_BAD_RESPONSE, f"not a JetStream delivery: {msg.reply!r}"
        )
    return Delivery(
        subject=msg.subject,
        stream_seq=meta.stream_seq,
        consumer_seq=meta.consumer_seq,
        pending=meta.pending,
        timestamp_ns=meta.timestamp_ns,
        headers=msg.headers,
        data=msg.data,
    )


class ConsumerScan:
    """``async with ConsumerScan(...) as scan``: read ``await scan.next(n)`` until ``done``.

    ``filters`` are subject filters (one, or several for ``filter_subjects``). The scan starts
    at ``start_seq``, or at the first message stored at or after ``start_time`` (a NATS time
    text), or from the beginning, or with the last message of every subject
    (``last_per_subject``).
    """

    def __init__(
        self,
        js: JetStreamApi,
        stream: str,
        filters: list[str],
        *,
        start_seq: int | None = None,
        start_time: str | None = None,
        last_per_subject: bool = False,
        headers_only: bool = False,
    ) -> None:
        self.js = js
        self.stream = stream
        self.filters = filters
        self.start_seq = start_seq
        self.start_time = start_time
        self.last_per_subject = last_per_subject
        self.headers_only = headers_only
        self.name: str | None = None
        self.pending = 0
        self.done = False

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "ack_policy": "none",
            "headers_only": self.headers_only,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": _INACTIVE_THRESHOLD_NS,
            "replay_policy": "instant",
        }
        if len(self.filters) == 1:
            config["filter_subject"] = self.filters[0]
        else:
            config["filter_subjects"] = self.filters
        if self.last_per_subject:
            config["deliver_policy"] = "last_per_subject"
        elif self.start_seq is not None and self.start_seq > 1:
            config["deliver_policy"] = "by_start_sequence"
            config["opt_start_seq"] = self.start_seq
        elif self.start_time is not None:
            config["deliver_policy"] = "by_start_time"
            config["opt_start_time"] = self.start_time
        else:
            config["deliver_policy"] = "all"
        return config

    async def __aenter__(self) -> ConsumerScan:
        body = {"stream_name": self.stream, "config": self._config()}
        info = await self.js.call("consumer.create", "CONSUMER", "CREATE", self.stream, body=body)
        self.name = str(info["name"])
        self.pending = int(info.get("num_pending", 0))
        self.done = self.pending == 0
        return self

    async def next(self, count: int) -> list[Delivery]:
        """Up to ``count`` more messages, in stream order (fewer once the scan is done)."""
        if self.done or self.name is None:
            return []
        pool = self.js.pool
        subject = self.js.subject("CONSUMER", "MSG", "NEXT", self.stream, self.name)
        outcome = await pool.observe(
            "consumer.scan",
            lambda: fetch(
                pool.pick(),
                subject,
                PullRequest(batch=count, no_wait=True),
                timeout=pool.wait(operation="consumer.scan"),
            ),
        )
        if outcome.status is not None and not outcome.status.ends_quietly:
            raise outcome.status.error()
        if outcome.stalled and not outcome.messages:
            raise errors.Timeout(
                ErrorCode.NATS_TIMEOUT, "NATS stopped answering in the middle of a scan"
            )
        messages = [delivery(msg) for msg in outcome.messages]
        if messages:
            self.pending = messages[-1].pending
        if not messages or self.pending == 0:
            self.done = True
        return messages

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.name is None:
            return
        try:
            await self._delete()
            return
        except errors.GatewayError:
            pass
        # Not deleted: often because the answer the scan was for ran out of its time
        # (NatsPool.within). Asked again after the answer, with a timeout of its own, outside
        # that answer's context; best effort: a consumer left behind expires after its
        # inactive threshold anyway.
        run_to_end(self._delete(), context=contextvars.Context())

    async def _delete(self) -> None:
        await self.js.call("consumer.delete", "CONSUMER", "DELETE", self.stream, str(self.name))
