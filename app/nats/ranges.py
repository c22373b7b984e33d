"""A range of stream sequences read through an ordered push consumer, at the reader's pace.

Batch Direct Get needs ``allow_direct``, which NATS leaves off by default. This reads the same
messages through a consumer instead, as ADR-17's ordered consumer does, bounded to a range:
an ephemeral push consumer (``ack_policy: none``, ``deliver_policy: by_start_sequence``,
flow control, idle heartbeats, memory storage, an ``inactive_threshold``) delivering to a
fresh inbox; the reader takes what arrived whenever it wants more.

Memory stays bounded whatever the reader does. The server sends no more than its flow-control
window (2 MiB at first, doubling with each answer up to 32 MiB) before it waits for the answer
to its flow-control request, and that answer is sent only when the reader takes the request
off the queue, that is once every message delivered before it has been handed on. A reader
that stops (an HTTP client that reads no more) leaves at most one window waiting here.

Order and completeness: every delivery must carry the next consumer sequence, and every idle
heartbeat the last one sent. A gap, a heartbeat that disagrees, or silence for two heartbeat
intervals re-creates the consumer from the stream sequence after the last one handed on (a
stream info first tells a deleted stream apart). Nothing is handed on twice: a message is
handed on only with the expected consumer sequence of the current consumer, whose start is
after everything handed on.

The read ends at ``last``, which never lies past the stream's last sequence when the read
began, so every message it may return was stored then: it ends at the first delivery at or
past ``last`` (one past it is not handed on), at a delivery with nothing pending after it, or
at an idle heartbeat without a flow-control stall (the consumer had nothing to send).

The consumer is deleted when the read ends or is closed. :meth:`RangeRead.aclose` is
idempotent; a read cancelled part way (its HTTP client went away) unsubscribes at once and
deletes the consumer from a task of its own, since awaiting in a cancelled task is cancelled
again; should even that fail, the consumer's ``inactive_threshold`` removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app import errors
from app.durations import NS_PER_SECOND
from app.nats.acks import parse_ack_subject
from app.nats.direct import META_HEADERS, PAGE_BYTES, PAGE_MESSAGES, EndOfBatch, StoredMessage
from app.nats.headers import from_nats_py
from app.nats.jsapi import JetStreamApi
from app.nats.pull import unsubscribe
from app.tasks import run_to_end

log = logging.getLogger("jsgw.ranges")

IDLE_HEARTBEAT = 1.0  # seconds
_MISSED_HEARTBEATS = 2
_INACTIVE_THRESHOLD_NS = 30 * NS_PER_SECOND
_MAX_RECREATES = 5  # in a row without progress: the read fails rather than loop
# nats-py drops what exceeds these (a gap, so a re-created consumer): above one flow-control
# window of the server (32 MiB at most) with room for small messages' overhead.
_PENDING_BYTES = 48 * 1024 * 1024
_PENDING_MSGS = 1024 * 1024
_LAST_CONSUMER = "Nats-Last-Consumer"
_STALLED = "Nats-Consumer-Stalled"


class _Time:
    """Nanosecond Unix times as RFC 3339 UTC, trailing zeros trimmed (as ``Nats-Time-Stamp``
    has them, so that both reads agree to the character), with the
    second's text kept: a bulk read sees the same second thousands of times."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self, timestamp_ns: int) -> str:
        second, fraction = divmod(timestamp_ns, NS_PER_SECOND)
        if second != self._second:
            self._second = second
            self._text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        if not fraction:
            return f"{self._text}Z"
        return f"{self._text}.{f'{fraction:09d}'.rstrip('0')}Z"


class RangeRead:
    """``async for item in RangeRead(...).items()``: the messages of ``first..last`` (those
    on ``filter_subject``), in stream order, then one :class:`EndOfBatch` whose ``last_seq``
    is the end of the range read (clamped to the stream's last sequence at the start)."""

    def __init__(
        self,
        js: JetStreamApi,
        stream: str,
        first: int,
        last: int,
        *,
        filter_subject: str | None = None,
        idle_heartbeat: float = IDLE_HEARTBEAT,
    ) -> None:
        self.js = js
        self.stream = stream
        self.first = first
        self.last = last
        self.filter_subject = filter_subject
        self.idle_heartbeat = idle_heartbeat
        self._position = first - 1  # the last stream sequence handed on (or skipped over)
        self._expected = 1
        self._client: Client | None = None
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._ack_prefix = ""
        self._queue: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._created: str | None = None
        self._time = _Time()

    # -- reading ---------------------------------------------------------------------------

    async def items(self) -> AsyncIterator[list[StoredMessage] | EndOfBatch]:
        """Pages of messages, as a batch Direct Get yields them, then one EOB: a page is what
        has arrived when the read would wait for more (at most PAGE_MESSAGES / PAGE_BYTES),
        so it never holds more than the server sent in one flow-control window."""
        try:
            info = await self.js.call("stream.info", "STREAM", "INFO", self.stream)
            if (info.get("config") or {}).get("retention") == "workqueue":
                raise errors.Conflict(
                    errors.ErrorCode.STREAM_RANGE_WORKQUEUE,
                    f"stream {self.stream!r} is a work queue: a range read cannot have a "
                    "consumer of its own there",
                )
            self._created = info.get("created")
            self.last = min(self.last, int((info.get("state") or {}).get("last_seq", 0)))
            if self.first <= self.last and await self._attach():
                page: list[StoredMessage] = []
                size = 0
                async for message in self._deliveries():
                    page.append(message)
                    size += len(message.data)
                    if not self._queue or len(page) >= PAGE_MESSAGES or size >= PAGE_BYTES:
                        yield page
                        page, size = [], 0
                if page:
                    yield page
            yield EndOfBatch(num_pending=0, last_seq=max(self.last, self.first - 1))
        finally:
            release = self._release_soon()
            task = asyncio.current_task()
            if release is not None and not (task is not None and task.cancelling()):
                await asyncio.shield(release)

    async def _deliveries(self) -> AsyncIterator[StoredMessage]:
        recreates = 0
        while True:
            msg = await self._next()
            if msg is None:  # a stall: nothing, not even a heartbeat, for two intervals
                recreates = await self._recreate(recreates, "silent")
                if recreates < 0:
                    return
                continue
            if not msg.reply or not msg.reply.startswith("$JS.ACK."):
                done, reset = await self._control(msg)
                if done:
                    return
                if reset:
                    recreates = await self._recreate(recreates, "out of step")
                    if recreates < 0:
                        return
                continue
            stream_seq, consumer_seq, timestamp_ns, pending = self._metadata(msg.reply)
            if consumer_seq != self._expected:
                recreates = await self._recreate(recreates, "a gap")
                if recreates < 0:
                    return
                continue
            recreates = 0
            self._expected += 1
            if stream_seq > self.last:
                return
            self._position = stream_seq
            yield StoredMessage(
                stream=self.stream,
                subject=msg.subject,
                seq=stream_seq,
                time=self._time(timestamp_ns),
                # As Direct Get answers them: without the Nats-* headers a reply describes
                # (which a message republished from another stream carries itself).
                headers=_own_headers(msg.headers) if msg.headers else {},
                data=msg.data,
            )
            if stream_seq >= self.last or pending == 0:
                return

    def _metadata(self, reply: str) -> tuple[int, int, int, int]:
        """(stream seq, consumer seq, time, pending) of a delivery's ack subject.

        The subject of this consumer's deliveries in the common form is split directly
        (this runs for every message of a bulk read); any other goes through the full check.
        """
        prefix = self._ack_prefix
        if prefix and reply.startswith(prefix):
            numbers = reply[len(prefix) :].split(".")
            if len(numbers) == 5 and all(n.isascii() and n.isdigit() for n in numbers):
                return int(numbers[1]), int(numbers[2]), int(numbers[3]), int(numbers[4])
        meta = parse_ack_subject(reply)
        if meta is None or (meta.stream, meta.consumer) != (self.stream, self._consumer):
            raise errors.UpstreamError(
                errors.ErrorCode.JETSTREAM_BAD_RESPONSE, f"not a delivery of this read: {reply!r}"
            )
        return meta.stream_seq, meta.consumer_seq, meta.timestamp_ns, meta.pending

    async def _next(self) -> Msg | None:
        """The next message of the current consumer, or None after two heartbeats of silence."""
        queue = self._queue
        if not queue:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._arrived.wait(), _MISSED_HEARTBEATS * self.idle_heartbeat
                )
            if not queue:
                return None
        return queue.popleft()

    async def _control(self, msg: Msg) -> tuple[bool, bool]:
        """A status message on the inbox: (the read is over, the consumer must be re-created).

        A flow-control request is answered now that everything before it was handed on."""
        headers = msg.headers or {}
        if headers.get("Status") != "100":
            return False, False  # nothing else is sent to a push consumer's inbox
        replies = [msg.reply] if msg.reply else []
        stalled = headers.get(_STALLED)
        if stalled:
            replies.append(stalled)
        client = self._client
        if client is not None:
            for reply in replies:
                with contextlib.suppress(nats.errors.Error):
                    await client.publish(reply, b"")
        if msg.reply:
            return False, False  # a flow-control request
        last = headers.get(_LAST_CONSUMER)
        if last is not None and last.isdigit() and int(last) != self._expected - 1:
            return False, True
        # An idle heartbeat: nothing was there to send, unless flow control held it back.
        return not stalled, False

    # -- consumers -------------------------------------------------------------------------

    def _config(self, inbox: str) -> dict[str, Any]:
        config: dict[str, Any] = {
            "deliver_subject": inbox,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": self._position + 1,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(self.idle_heartbeat * NS_PER_SECOND),
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": _INACTIVE_THRESHOLD_NS,
            "replay_policy": "instant",
        }
        if self.filter_subject is not None:
            config["filter_subject"] = self.filter_subject
        return config

    async def _attach(self) -> bool:
        """Subscribe a fresh inbox and create a consumer delivering to it from the position;
        False when it has nothing to deliver."""
        client = self.js.pool.pick()
        inbox = client.new_inbox()
        queue, arrived = deque[Msg](), asyncio.Event()
        self._queue, self._arrived = queue, arrived

        async def on_msg(msg: Msg) -> None:
            queue.append(msg)
            arrived.set()

        sub = await client.subscribe(
            inbox, cb=on_msg, pending_msgs_limit=_PENDING_MSGS, pending_bytes_limit=_PENDING_BYTES
        )
        self._client, self._sub = client, sub
        body = {"stream_name": self.stream, "config": self._config(inbox)}
        try:
            info = await self.js.call(
                "consumer.create", "CONSUMER", "CREATE", self.stream, body=body
            )
        except errors.InvalidInput as exc:
            if exc.code is not errors.ErrorCode.CONSUMER_FILTER_INVALID:
                raise
            # A filter outside the stream's subjects matches no message: nothing to read.
            return False
        self._consumer = str(info["name"])
        # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
        self._ack_prefix = f"$JS.ACK.{self.stream}.{self._consumer}."
        self._expected = 1
        return int(info.get("num_pending", 0)) > 0

    async def _recreate(self, recreates: int, why: str) -> int:
        """A new consumer from the position on: the count of re-creations in a row, or -1
        when the new one has nothing left to deliver."""
        if recreates >= _MAX_RECREATES:
            raise errors.Timeout(
                errors.ErrorCode.NATS_TIMEOUT,
                f"the consumer reading stream {self.stream!r} stopped delivering",
            )
        log.info("read of %s re-creates its consumer at %d (%s)", self.stream, self._position, why)
        release = self._release_soon()
        if release is not None:
            await asyncio.shield(release)
        info = await self.js.call("stream.info", "STREAM", "INFO", self.stream)
        if info.get("created") != self._created:
            raise errors.StreamDeleted(detail=f"stream {self.stream!r} was deleted")
        if self._position >= self.last or not await self._attach():
            return -1
        return recreates + 1

    def _release_soon(self) -> asyncio.Task[None] | None:
        """Let go of the subscription and the consumer, in a task of its own: a caller that is
        cancelled (its HTTP client went away) cannot stop it half-way, as it would stop its
        own awaits."""
        sub, consumer = self._sub, self._consumer
        self._sub = self._consumer = None
        self._queue = deque()
        if sub is None and consumer is None:
            return None
        return run_to_end(self._release(sub, consumer))

    async def _release(self, sub: Subscription | None, consumer: str | None) -> None:
        if sub is not None:
            await unsubscribe(sub)
        if consumer is not None:
            with contextlib.suppress(errors.GatewayError):
                await self.js.call("consumer.delete", "CONSUMER", "DELETE", self.stream, consumer)

    async def aclose(self) -> None:
        """Unsubscribe and delete the consumer now (idempotent)."""
        release = self._release_soon()
        if release is not None:
            await asyncio.shield(release)


def _own_headers(headers: dict[str, str]) -> dict[str, list[str]]:
    return {k: v for k, v in from_nats_py(headers).items() if k not in META_HEADERS}
