"""Counters (ADR-49) over the shared kit: an increment is a publish with a ``Nats-Incr``
header and no payload, answered by a PubAck that carries the new value (``val``); a value is
the last message on the subject, ``{"val": "<decimal>"}``, read by Direct Get (the stream
leader's ``STREAM.MSG.GET`` when the stream has no Direct Get), many at one point in time by
the multi reads of :class:`app.direct.service.DirectService`.

Values stay decimal strings from end to end: the server keeps them as big integers, and a
float (or a 64-bit integer) would round them.

An increment is never sent twice: it is not idempotent (``Nats-Msg-Id`` is not allowed with
it), so a timeout is ``nats.outcome_unknown`` and the client reads the counter to learn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from app import errors, validation
from app.direct.service import DirectService
from app.errors import ErrorCode
from app.nats import features
from app.nats.direct import DirectGet, StoredMessage, leader_message
from app.nats.floors import RevisionFloors
from app.nats.jsapi import JetStreamApi
from app.publish.service import Outgoing, Publisher
from app.streams.service import StreamService

INCREMENT_HEADER = "Nats-Incr"
SOURCES_HEADER = "Nats-Counter-Sources"


class CounterService:
    def __init__(
        self,
        js: JetStreamApi,
        direct: DirectGet,
        reads: DirectService,
        streams: StreamService,
        publisher: Publisher,
    ) -> None:
        self.js = js
        self.pool = js.pool
        self.direct = direct
        self.reads = reads
        self.streams = streams
        self.publisher = publisher
        self.floors = RevisionFloors()  # see get() and app.nats.floors

    async def increment(self, stream: str, subject: str, increment: str) -> dict[str, Any]:
        """Add ``increment`` (as :func:`app.counters.schemas.increment_text` made it) to the
        counter ``subject`` of ``stream``; the new value comes back with its sequence."""
        validation.stream_name(stream)
        self.pool.require(features.COUNTERS)
        subject = validation.publish_subject(subject)
        await self._captured(stream, subject)
        message = Outgoing(subject, b"", {INCREMENT_HEADER: increment})
        ack = await self.publisher.publish(message, operation="counter")
        value = ack.get("val")
        if not isinstance(value, str):
            raise errors.UpstreamError(
                ErrorCode.JETSTREAM_BAD_RESPONSE, "the PubAck of an increment had no value"
            )
        self.floors.advance(floor_key(stream, subject), ack["seq"])  # read-your-writes
        return {"stream": ack["stream"], "subject": subject, "seq": ack["seq"], "value": value}

    async def _captured(self, stream: str, subject: str) -> None:
        """Refuse (before sending) a subject that ``stream`` does not store: the increment
        would go to whichever stream does (``Nats-Expected-Stream`` cannot go with it)."""
        captured = await self.streams.capturing(subject)
        if captured == stream:
            return
        await self.js.call("stream.info", "STREAM", "INFO", stream)  # 404 when it is not there
        # (not which stream: the token may not know of it)
        where = "another stream stores it" if captured else "no stream stores it"
        raise errors.for_code(
            ErrorCode.COUNTER_WRONG_STREAM,
            f"stream {stream!r} does not capture subject {subject!r} ({where}): not sent",
        )

    async def get(self, stream: str, subject: str) -> dict[str, Any]:
        """The counter's value, from the last message on its subject; never older than what
        this process answered or incremented it to (:mod:`app.nats.floors`)."""
        validation.stream_name(stream)
        self.pool.require(features.COUNTERS)
        subject = validation.subject(subject)
        key = floor_key(stream, subject)
        floor = self.floors.revisions.get(key, 0)
        started = time.monotonic()
        message = await self._last(stream, subject)
        seen = 0 if message is None else message.seq
        if seen < floor:
            # A replica (or a mirror) behind an answer given or an increment acknowledged:
            # the stream leader has every acknowledged increment, read in what is left of
            # the request's time.
            with self.pool.within(started):
                message = await self._leader_last(stream, subject)
            self.floors.settle(key, floor, 0 if message is None else message.seq)
        elif seen > floor:
            self.floors.advance(key, seen)
        if message is None:
            raise errors.for_code(
                ErrorCode.COUNTER_NOT_FOUND, f"counter {subject!r} was never incremented"
            )
        out: dict[str, Any] = {
            "stream": stream,
            "subject": message.subject,
            "seq": message.seq,
            "value": await self._value(stream, message),
        }
        sources = _sources(message)
        if sources is not None:
            out["sources"] = sources
        return out

    async def _last(self, stream: str, subject: str) -> StoredMessage | None:
        """The subject's last message by Direct Get (any replica), or from the leader when
        the stream has no Direct Get."""
        try:
            return await self.direct.last_for(stream, subject)
        except errors.DirectNotAllowed:
            return await self._leader_last(stream, subject)
        except errors.MessageNotFound:
            return None

    async def _leader_last(self, stream: str, subject: str) -> StoredMessage | None:
        request = {"last_by_subj": subject}
        return await leader_message(self.js, stream, request, operation="stream.msg_get")

    async def read(
        self,
        stream: str,
        subjects: list[str],
        up_to_seq: int | None,
        visible: Callable[[str], bool] | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """Every counter matching ``subjects`` as of one sequence (the stream's last when
        ``up_to_seq`` is not given): (that sequence, the counters in sequence order).
        ``visible``: whether the reader may see a subject; the others are left out before
        anything is made of them (their values are neither converted nor named)."""
        self.pool.require(features.COUNTERS)
        pinned, messages = await self.reads.multi(
            stream, subjects, up_to_seq=up_to_seq, up_to_time=None, page_size=None
        )
        if visible is not None:
            messages = [m for m in messages if visible(m.subject)]
        counters = [
            {"subject": m.subject, "seq": m.seq, "value": await self._value(stream, m)}
            for m in messages
        ]
        return pinned, counters

    async def _value(self, stream: str, message: StoredMessage) -> str:
        value = counter_value(message.data)
        if value is not None:
            return value
        # Not a counter's message: a stream that does not count, or a broken value.
        info = await self.js.call("stream.info", "STREAM", "INFO", stream)
        if not (info.get("config") or {}).get("allow_msg_counter"):
            raise errors.for_code(
                ErrorCode.COUNTER_NOT_ALLOWED,
                f"stream {stream!r} does not count (allow_msg_counter is false)",
            )
        raise errors.for_code(
            ErrorCode.COUNTER_BROKEN,
            f"the last message on {message.subject!r} (seq {message.seq}) is not a counter value",
        )


def floor_key(stream: str, subject: str) -> str:
    """A counter's key in the floors (a space is in neither name)."""
    return f"{stream} {subject}"


def counter_value(data: bytes) -> str | None:
    """The decimal value of a counter's message ``{"val": "<decimal>"}``; None otherwise."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    value = document.get("val") if isinstance(document, dict) else None
    if not isinstance(value, str) or not value.lstrip("-").isdigit() or not value.isascii():
        return None
    return value


def _sources(message: StoredMessage) -> dict[str, dict[str, str]] | None:
    values = message.headers.get(SOURCES_HEADER)
    if not values:
        return None
    try:
        sources = orjson.loads(values[-1])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(sources, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
        for v in sources.values()
    ):
        return None
    return sources
