"""Direct Get (ADR-31), spoken on top of nats-py's core request/subscribe.

nats-py can read one message by Direct Get, but not batches or ``multi_last``: a batch request
is answered by several messages on the reply subject, ended by a ``204 EOB`` status message
carrying ``Nats-Num-Pending``, ``Nats-Last-Sequence`` and (for multi reads)
``Nats-UpTo-Sequence``. This module sends the requests and reads those replies.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import orjson
from nats.aio.msg import Msg

from app import errors
from app.durations import nats_time
from app.errors import ErrorCode, NoResponders
from app.nats.headers import from_nats_py, parse_b64, split_block, values_of
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.nats.pull import unsubscribe
from app.nats.replies import Reply

# What one server request may bring back at most: this bounds the gateway's memory per
# request, whatever the HTTP client asked for in total (the gateway pages).
PAGE_MESSAGES = 1000
PAGE_BYTES = 4 * 1024 * 1024
MAX_MULTI_SUBJECTS = 1024
_PENDING_SLACK = 1024 * 1024
_NOT_DIRECT_TTL = 2.0


@dataclass(slots=True)
class StoredMessage:
    stream: str
    subject: str
    seq: int
    time: str | None
    headers: dict[str, list[str]]
    data: bytes
    last_seq: int | None = None
    num_pending: int | None = None

    @classmethod
    def from_msg_get(cls, stream: str, raw: dict[str, Any]) -> StoredMessage:
        """A message as ``$JS.API.STREAM.MSG.GET`` returns it (base64 headers and data)."""
        return cls(
            stream=stream,
            subject=raw.get("subject", ""),
            seq=raw.get("seq", 0),
            time=nats_time(raw.get("time")),
            headers=parse_b64(raw.get("hdrs")).values,
            data=base64.b64decode(raw.get("data") or ""),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "subject": self.subject,
            "seq": self.seq,
            "time": self.time,
            "headers": self.headers,
            "data": base64.b64encode(self.data).decode(),
        }


@dataclass(slots=True)
class EndOfBatch:
    num_pending: int
    last_seq: int
    up_to_seq: int | None = None


_META_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
    }
)
# What a single Direct Get's reply always carries, in the server's spelling.
_SINGLE_META = ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp")
_OTHER_META = tuple(sorted(_META_HEADERS - set(_SINGLE_META)))


def _int(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


def _from_direct_reply(reply: Reply) -> StoredMessage:
    """The message a single Direct Get answered with (or its status as an error).

    The common reply, a plain status line and the server's own names for its headers, is
    read without the header block's case-insensitive lookups; anything else goes through the
    parsed header block (the same result, found the slow way).
    """
    first, *lines = split_block(reply.raw_headers or b"")
    if first == "NATS/1.0":
        own = values_of(lines)
        stream, subject, seq, stamp = (own.pop(name, None) for name in _SINGLE_META)
        if stream and subject and seq and stamp:
            for name in _OTHER_META:
                own.pop(name, None)
            return StoredMessage(
                stream=stream[0],
                subject=subject[0],
                seq=_sequence(seq[0]),
                time=stamp[0],
                headers=own,
                data=reply.data,
            )
    block = reply.headers
    if block.status is not None:
        raise _status_error(block.status, block.description)
    return StoredMessage(
        stream=block.first("Nats-Stream") or "",
        subject=block.first("Nats-Subject") or "",
        seq=_sequence(block.first("Nats-Sequence")),
        time=block.first("Nats-Time-Stamp"),
        headers={k: v for k, v in block.values.items() if k not in _META_HEADERS},
        data=reply.data,
    )


def _sequence(value: str | None) -> int:
    """A ``Nats-Sequence`` value: digits 0-9 (``int`` would also take "²" and fail), else 0."""
    return int(value) if value and value.isascii() and value.isdigit() else 0


def _status(msg: Msg) -> int | None:
    headers = msg.headers or {}
    status = headers.get("Status")
    return int(status) if status and status.isdigit() else None


def to_message(msg: Msg) -> StoredMessage:
    headers = msg.headers or {}
    return StoredMessage(
        stream=headers.get("Nats-Stream", ""),
        subject=headers.get("Nats-Subject", ""),
        seq=_int(headers, "Nats-Sequence") or 0,
        time=headers.get("Nats-Time-Stamp"),
        headers={k: v for k, v in from_nats_py(headers).items() if k not in _META_HEADERS},
        data=msg.data,
        last_seq=_int(headers, "Nats-Last-Sequence"),
        num_pending=_int(headers, "Nats-Num-Pending"),
    )


@dataclass
class DirectGet:
    js: JetStreamApi
    _not_direct: dict[str, float] = field(default_factory=dict)
    # Called with a stream's name when it is forgotten (created, changed or deleted here).
    on_forget: list[Callable[[str], None]] = field(default_factory=list)

    @property
    def pool(self) -> NatsPool:
        return self.js.pool

    def forget(self, stream: str) -> None:
        """Drop what is cached about a stream (its config may have changed)."""
        self._not_direct.pop(stream, None)
        for listener in self.on_forget:
            listener(stream)

    # -- single messages -------------------------------------------------------------------

    async def get(self, stream: str, request: dict[str, Any]) -> StoredMessage:
        """One message: ``seq``, ``last_by_subj``, ``next_by_subj`` (+``seq``), ``start_time``."""
        subject = self.js.subject("DIRECT", "GET", stream)
        return await self._single(stream, subject, orjson.dumps(request))

    def last_for(self, stream: str, subject: str) -> Awaitable[StoredMessage]:
        """The last message on a literal subject (subject-appended form, no payload)."""
        # The request's own coroutine is returned: one fewer on the hottest read.
        return self._single(stream, self.js.subject("DIRECT", "GET", stream, subject), b"")

    async def _single(self, stream: str, subject: str, payload: bytes) -> StoredMessage:
        self._check_direct(stream)
        try:
            reply = await self.pool.request(subject, payload, operation="direct.get")
        except NoResponders:
            raise await self._why_no_responders(stream) from None
        return _from_direct_reply(reply)

    # -- batches ---------------------------------------------------------------------------

    async def page(
        self, stream: str, request: dict[str, Any], *, operation: str = "direct.batch"
    ) -> AsyncIterator[StoredMessage | EndOfBatch]:
        """One batch request: yields its messages as they arrive, then its EndOfBatch.

        A 404 (nothing matched) yields an EndOfBatch with nothing pending.
        """
        self._check_direct(stream)
        client = self.pool.pick()
        inbox = client.new_inbox()
        sub = await client.subscribe(
            inbox,
            pending_msgs_limit=PAGE_MESSAGES * 2 + 8,
            pending_bytes_limit=PAGE_BYTES * 2 + _PENDING_SLACK,
        )
        timeout = self.pool.timeout
        try:
            await self.pool.observe(
                operation,
                lambda: client.publish(
                    self.js.subject("DIRECT", "GET", stream), orjson.dumps(request), reply=inbox
                ),
            )
            first = True
            previous: int | None = None
            while True:
                try:
                    msg = await sub.next_msg(timeout)
                except nats.errors.TimeoutError:
                    raise errors.Timeout(
                        ErrorCode.NATS_TIMEOUT, "NATS stopped answering in the middle of a batch"
                    ) from None
                status = _status(msg)
                if status == 204:
                    headers = msg.headers or {}
                    yield EndOfBatch(
                        num_pending=_int(headers, "Nats-Num-Pending") or 0,
                        last_seq=_int(headers, "Nats-Last-Sequence") or 0,
                        up_to_seq=_int(headers, "Nats-UpTo-Sequence"),
                    )
                    return
                if status == 404:
                    yield EndOfBatch(num_pending=0, last_seq=request.get("seq", 1) - 1)
                    return
                if status == 503:
                    raise await self._why_no_responders(stream)
                if status is not None:
                    raise _status_error(status, _description(msg))
                message = to_message(msg)
                if first and message.num_pending is None:
                    raise _batch_unsupported()
                # Each reply names the sequence before it: a gap means a reply was lost.
                if previous is not None and message.last_seq != previous:
                    raise errors.UpstreamError(
                        ErrorCode.DIRECT_GAP, "a Direct Get reply was lost; retry the request"
                    )
                previous, first = message.seq, False
                yield message
        finally:
            await unsubscribe(sub)

    async def batch(
        self,
        stream: str,
        *,
        seq: int | None = None,
        next_by_subj: str | None = None,
        start_time: str | None = None,
        limit: int,
        max_bytes: int | None = None,
    ) -> AsyncIterator[StoredMessage | EndOfBatch]:
        """Up to ``limit`` messages (and ``max_bytes``), paging server batches; then one EOB."""
        remaining, budget = limit, max_bytes
        eob = EndOfBatch(num_pending=0, last_seq=(seq or 1) - 1)
        request: dict[str, Any] = {}
        if seq is not None:
            request["seq"] = seq
        if next_by_subj is not None:
            request["next_by_subj"] = next_by_subj
        if start_time is not None:
            request["start_time"] = start_time
        while remaining > 0 and (budget is None or budget > 0):
            page_request = dict(request, batch=min(remaining, PAGE_MESSAGES))
            page_request["max_bytes"] = min(budget or PAGE_BYTES, PAGE_BYTES)
            got = 0
            async for item in self.page(stream, page_request):
                if isinstance(item, EndOfBatch):
                    eob = item
                    break
                got += 1
                remaining -= 1
                if budget is not None:
                    budget -= len(item.data) + len(item.subject)
                yield item
            if got == 0 or eob.num_pending == 0:
                break
            request.pop("start_time", None)
            request["seq"] = eob.last_seq + 1
        yield eob

    # -- consistent multi-subject reads ----------------------------------------------------

    async def resolve_up_to(
        self, stream: str, up_to_seq: int | None, up_to_time: str | None
    ) -> int:
        """The stream sequence a multi read is pinned to, fixed before anything is read."""
        if up_to_seq is not None:
            return up_to_seq
        if up_to_time is not None:
            try:
                first_after = await self.get(stream, {"start_time": up_to_time})
                return first_after.seq - 1
            except errors.NotFound:
                pass
        info = await self.js.call("stream.info", "STREAM", "INFO", stream)
        return int((info.get("state") or {}).get("last_seq", 0))

    async def multi_last(
        self, stream: str, subjects: list[str], up_to_seq: int, page_size: int | None = None
    ) -> AsyncIterator[StoredMessage]:
        """The last message of every subject matched, as of ``up_to_seq``.

        Lists longer than the server's 1024-subject limit are split; every request and every
        page of every request is pinned to the same ``up_to_seq``.
        """
        seen: set[int] = set()
        for start in range(0, len(subjects), MAX_MULTI_SUBJECTS):
            chunk = subjects[start : start + MAX_MULTI_SUBJECTS]
            request: dict[str, Any] = {"multi_last": chunk, "up_to_seq": up_to_seq}
            if page_size:
                request["batch"] = page_size
            while True:
                # What is left after the last message read: its own Nats-Num-Pending, which
                # every release reports alike (nats-server 2.11's end of batch counts one
                # fewer when a page is cut short, so a last message left over looked done).
                last: StoredMessage | None = None
                async for item in self.page(stream, request, operation="direct.multi"):
                    if isinstance(item, EndOfBatch):
                        continue
                    last = item
                    if item.seq not in seen:
                        seen.add(item.seq)
                        yield item
                if last is None or not last.num_pending:
                    break
                request = dict(request, seq=last.seq + 1)

    # -- errors ----------------------------------------------------------------------------

    def _check_direct(self, stream: str) -> None:
        expires = self._not_direct.get(stream)
        if expires is not None:
            if expires > time.monotonic():
                raise _not_allowed(stream)
            del self._not_direct[stream]

    async def _why_no_responders(self, stream: str) -> errors.GatewayError:
        """Nobody answered a Direct Get: tell a missing stream from one without allow_direct."""
        info = await self.js.call("stream.info", "STREAM", "INFO", stream)
        if not (info.get("config") or {}).get("allow_direct"):
            self._not_direct[stream] = time.monotonic() + _NOT_DIRECT_TTL
            return _not_allowed(stream)
        return errors.Unavailable(
            ErrorCode.DIRECT_UNAVAILABLE, "no server answered the Direct Get; retry shortly"
        )


def _batch_unsupported() -> errors.GatewayError:
    return errors.BatchUnsupported(
        detail="the NATS server does not support batched Direct Get, multi_last or "
        "start_time (nats-server 2.11 or later is needed)",
    )


def _not_allowed(stream: str) -> errors.GatewayError:
    return errors.DirectNotAllowed(
        detail=f"stream {stream!r} does not allow Direct Get (allow_direct is false); "
        "enable it, or read with consistency=leader",
    )


def _description(msg: Msg) -> str:
    return str((msg.headers or {}).get("Description", "")).strip()


def _status_error(status: int, description: str) -> errors.GatewayError:
    if status == 404:
        return errors.MessageNotFound(detail="no message matches the request")
    if status == 413:
        return errors.PayloadTooLarge(
            ErrorCode.DIRECT_TOO_MANY_SUBJECTS,
            "the subject filters match more than 1024 subjects: narrow the filters, "
            "or list the subjects (keys) explicitly",
        )
    if status == 408 and description == "Empty Request":
        # The gateway never sends one: the server knows none of the request's fields, as
        # nats-server 2.10 knows neither start_time nor multi_last.
        return _batch_unsupported()
    if status == 408:
        return errors.InvalidInput(
            ErrorCode.DIRECT_BAD_REQUEST, f"the server refused the request: {description}"
        )
    return errors.UpstreamError(
        ErrorCode.DIRECT_ERROR, f"Direct Get answered {status} {description}"
    )
