"""Direct Get (ADR-31), spoken on top of nats-py's core request/subscribe.

nats-py can read one message by Direct Get, but not batches or ``multi_last``: a batch request
is answered by several messages on the reply subject, ended by a ``204 EOB`` status message
carrying ``Nats-Num-Pending``, ``Nats-Last-Sequence`` and (for multi reads)
``Nats-UpTo-Sequence``. This module sends the requests and reads those replies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from app import errors
from app.durations import nats_time
from app.errors import ErrorCode, NoResponders
from app.nats import features
from app.nats.headers import folded, parse_b64, split_block, values_of
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.nats.replies import RawInbox, Reply

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
            # (base64.b64encode's own call, without its Python frame: once per message read)
            "data": binascii.b2a_base64(self.data, newline=False).decode(),
        }


@dataclass(slots=True)
class EndOfBatch:
    num_pending: int
    last_seq: int
    up_to_seq: int | None = None


META_HEADERS = frozenset(
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
_OTHER_META = tuple(sorted(META_HEADERS - set(_SINGLE_META)))


def _int(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


async def leader_message(
    js: JetStreamApi,
    stream: str,
    request: dict[str, Any],
    *,
    operation: str,
    timeout: float | None = None,
) -> StoredMessage | None:
    """``STREAM.MSG.GET``: the message the stream leader answers ``request`` with (``seq``,
    ``last_by_subj``, ``next_by_subj``...), or None when it has none."""
    try:
        result = await js.call(
            operation, "STREAM", "MSG", "GET", stream, body=request, timeout=timeout
        )
    except errors.MessageNotFound:
        return None
    return StoredMessage.from_msg_get(stream, result.get("message") or {})


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
        headers={k: v for k, v in block.values.items() if k not in META_HEADERS},
        data=reply.data,
    )


def _sequence(value: str | None) -> int:
    """A ``Nats-Sequence`` value: digits 0-9 (``int`` would also take "²" and fail), else 0."""
    return int(value) if value and value.isascii() and value.isdigit() else 0


# nats-py's names for a header block's status line, never a stored message's own header.
_STATUS_KEYS = frozenset({"Status", "Description"})
_HIDDEN = META_HEADERS | _STATUS_KEYS


# The header block nats-server writes on a batch reply whose message has no headers of its
# own (stream.go ``dgb``), values without whitespace (so nats-py's stripping leaves them as
# they are). Such a reply is read by one match; any other goes through :func:`folded`.
_PLAIN_REPLY = re.compile(
    rb"NATS/1\.0\r\nNats-Stream: (\S+)\r\nNats-Subject: (\S+)\r\nNats-Sequence: (\d+)\r\n"
    rb"Nats-Time-Stamp: (\S+)\r\nNats-Num-Pending: (\d+)\r\nNats-Last-Sequence: (\d+)\r\n\r\n"
)


def _plain_message(raw: bytes, data: bytes) -> StoredMessage | None:
    """The message of a reply in the common form, as :func:`_batch_message` would read it;
    None for any other reply."""
    match = _PLAIN_REPLY.fullmatch(raw)
    if match is None:
        return None
    stream, subject, seq, stamp, pending, last = match.groups()
    return StoredMessage(
        stream=stream.decode("utf-8", "replace"),
        subject=subject.decode("utf-8", "replace"),
        seq=int(seq),
        time=stamp.decode("utf-8", "replace"),
        headers={},
        data=data,
        last_seq=int(last),
        num_pending=int(pending),
    )


def _batch_message(headers: dict[str, str], data: bytes) -> StoredMessage:
    """A message of a batch, from its header dict as nats-py makes it (:func:`folded`)."""
    return StoredMessage(
        stream=headers.get("Nats-Stream", ""),
        subject=headers.get("Nats-Subject", ""),
        seq=_int(headers, "Nats-Sequence") or 0,
        time=headers.get("Nats-Time-Stamp"),
        headers={k: [v] for k, v in headers.items() if k not in _HIDDEN},
        data=data,
        last_seq=_int(headers, "Nats-Last-Sequence"),
        num_pending=_int(headers, "Nats-Num-Pending"),
    )


class _Inbox:
    """The replies to one read's batch requests, on one inbox of one connection.

    nats-py would hand each reply over as a ``Msg`` through the subscription's queue, one
    ``next_msg`` (a task and a timer) per message. Here the connection's parser gives each
    reply, raw, to :meth:`_on_reply`, which only keeps it: a page of replies is decoded in
    one pass once its end (a status reply) has come. The waiting read is woken twice per page
    at most: at the first reply (an old server answers a batch with one plain message and
    nothing after it) and at the end. Requests go one at a time (the next one once a page has
    ended), so the replies of two pages never mix.
    """

    __slots__ = ("_ended", "_first", "_replies", "_waiter", "raw")

    def __init__(self) -> None:
        self.raw: RawInbox | None = None
        self._replies: list[tuple[bytes | None, bytes]] = []
        self._ended = False
        self._first = False  # wake the reader at the first reply
        self._waiter: asyncio.Future[None] | None = None

    async def open(self, pool: NatsPool) -> None:
        self.raw = await pool.raw_inbox(self._on_reply)

    async def close(self) -> None:
        if self.raw is not None:
            await self.raw.close()

    def expect(self) -> None:
        """A request is about to be sent: its replies start a page."""
        self._replies = []
        self._ended = False

    def _on_reply(self, _subject: bytes, headers: bytes | None, data: bytes) -> None:
        self._replies.append((headers, data))
        if headers is not None and len(headers) > 8 and headers[8] == 0x20:  # "NATS/1.0 <code>"
            self._ended = True
        waiter = self._waiter
        if waiter is not None and (self._ended or self._first) and not waiter.done():
            waiter.set_result(None)

    async def replies(self, seen: int, timeout: float) -> list[tuple[bytes | None, bytes]]:
        """The page's replies, once more than ``seen`` have come and the page has ended (at
        the first reply, with ``seen`` 0, already); Timeout after ``timeout`` seconds in which
        no reply came."""
        loop = asyncio.get_running_loop()
        self._first = seen == 0
        while len(self._replies) <= seen or not (self._ended or self._first):
            count = len(self._replies)
            self._waiter = waiter = loop.create_future()
            try:
                await asyncio.wait((waiter,), timeout=timeout)
            finally:
                self._waiter = None
            if not waiter.done() and len(self._replies) == count:
                raise errors.Timeout(
                    ErrorCode.NATS_TIMEOUT, "NATS stopped answering in the middle of a batch"
                )
        return self._replies


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
        """One batch request: yields its messages, then its EndOfBatch.

        A 404 (nothing matched) yields an EndOfBatch with nothing pending.
        """
        inbox = await self._open(stream)
        try:
            await self._ask(inbox, stream, request, operation)
            messages, end = await self._read(inbox, stream, request, operation)
        finally:
            await inbox.close()
        for message in messages:
            yield message
        if isinstance(end, errors.GatewayError):
            raise end
        yield end

    async def batch(
        self,
        stream: str,
        *,
        seq: int | None = None,
        next_by_subj: str | None = None,
        start_time: str | None = None,
        limit: int,
        max_bytes: int | None = None,
    ) -> AsyncIterator[list[StoredMessage] | EndOfBatch]:
        """Up to ``limit`` messages (and ``max_bytes``), paging server batches; then one EOB.

        Yields the messages a page at a time (lists, never empty), in order. The next page is
        asked for before a page is handed on, so the server reads it while this one is
        encoded.
        """
        remaining, budget = limit, max_bytes
        eob = EndOfBatch(num_pending=0, last_seq=(seq or 1) - 1)
        request: dict[str, Any] = {}
        if seq is not None:
            request["seq"] = seq
        if next_by_subj is not None:
            request["next_by_subj"] = next_by_subj
        if start_time is not None:
            request["start_time"] = start_time
        if remaining <= 0 or (budget is not None and budget <= 0):
            yield eob
            return
        inbox = await self._open(stream)
        try:
            page_request = _page_request(request, remaining, budget)
            await self._ask(inbox, stream, page_request, "direct.batch")
            while True:
                messages, end = await self._read(inbox, stream, page_request, "direct.batch")
                remaining -= len(messages)
                if budget is not None:
                    budget -= sum(len(m.data) + len(m.subject) for m in messages)
                more = False
                if isinstance(end, EndOfBatch):
                    eob = end
                    more = (
                        remaining > 0
                        and (budget is None or budget > 0)
                        and bool(messages)
                        and end.num_pending != 0
                    )
                    if more:
                        request.pop("start_time", None)
                        request["seq"] = end.last_seq + 1
                        page_request = _page_request(request, remaining, budget)
                        try:
                            await self._ask(inbox, stream, page_request, "direct.batch")
                        except errors.GatewayError as exc:
                            # This page was read whole: it goes out, then the error.
                            end, more = exc, False
                if messages:
                    yield messages
                if isinstance(end, errors.GatewayError):
                    raise end
                if not more:
                    break
        finally:
            await inbox.close()
        yield eob

    def check_batches(self, stream: str) -> None:
        """Refuse a batched read at once, nothing sent: of a stream known not to allow Direct
        Get (409), or when the server's release has no batches (501: nats-server 2.10;
        callers that can read another way do)."""
        self._check_direct(stream)
        self.require_batches()

    def require_batches(self) -> None:
        """Refuse at once (501) when the server's release has no batched Direct Get, nor what
        came with it (``start_time``, ``multi_last``): nats-server 2.10."""
        if not self.pool.offers(features.BATCH_DIRECT_GET):
            raise _batch_unsupported()

    async def _open(self, stream: str) -> _Inbox:
        """The inbox of one batched read (:meth:`check_batches` first)."""
        self.check_batches(stream)
        inbox = _Inbox()
        await inbox.open(self.pool)
        return inbox

    async def _ask(
        self, inbox: _Inbox, stream: str, request: dict[str, Any], operation: str
    ) -> None:
        raw = inbox.raw
        assert raw is not None
        inbox.expect()
        subject = self.js.subject("DIRECT", "GET", stream)
        await self.pool.observe(operation, lambda: raw.request(subject, orjson.dumps(request)))

    async def _read(
        self, inbox: _Inbox, stream: str, request: dict[str, Any], operation: str
    ) -> tuple[list[StoredMessage], EndOfBatch | errors.GatewayError]:
        """A page: its messages, and its end, or the error that cut it short (the messages
        read before an error are the caller's to hand on first)."""
        messages: list[StoredMessage] = []
        previous: int | None = None
        seen = 0
        try:
            while True:
                replies = await inbox.replies(seen, self.pool.wait(operation=operation))
                for raw, data in replies[seen:]:
                    seen += 1
                    message = _plain_message(raw, data) if raw else None
                    if message is None:
                        headers = folded(raw)
                        code = headers.get("Status")
                        if code and code.isdigit():
                            return messages, await self._ended(stream, request, int(code), headers)
                        message = _batch_message(headers, data)
                    if previous is None and message.num_pending is None:
                        return messages, _batch_unsupported()
                    # Each reply names the sequence before it: a gap means a reply was lost.
                    if previous is not None and message.last_seq != previous:
                        return messages, errors.UpstreamError(
                            ErrorCode.DIRECT_GAP, "a Direct Get reply was lost; retry the request"
                        )
                    previous = message.seq
                    messages.append(message)
        except errors.Timeout as exc:
            return messages, exc

    async def _ended(
        self, stream: str, request: dict[str, Any], status: int, headers: dict[str, str]
    ) -> EndOfBatch | errors.GatewayError:
        """What a status reply to a batch request means: the end of the page, or an error."""
        if status == 204:
            return EndOfBatch(
                num_pending=_int(headers, "Nats-Num-Pending") or 0,
                last_seq=_int(headers, "Nats-Last-Sequence") or 0,
                up_to_seq=_int(headers, "Nats-UpTo-Sequence"),
            )
        if status == 404:
            return EndOfBatch(num_pending=0, last_seq=request.get("seq", 1) - 1)
        if status == 503:
            return await self._why_no_responders(stream)
        return _status_error(status, headers.get("Description", "").strip())

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


def _page_request(request: dict[str, Any], remaining: int, budget: int | None) -> dict[str, Any]:
    page = dict(request, batch=min(remaining, PAGE_MESSAGES))
    page["max_bytes"] = min(budget or PAGE_BYTES, PAGE_BYTES)
    return page


def _batch_unsupported() -> errors.GatewayError:
    return errors.BatchUnsupported(
        detail="the NATS server does not support batched Direct Get, multi_last or "
        "start_time (nats-server 2.11 or later is needed)",
    )


def too_many_subjects() -> errors.GatewayError:
    """What a multi read whose filters match more subjects than one server request may is
    answered (the server's 413)."""
    return errors.PayloadTooLarge(
        ErrorCode.DIRECT_TOO_MANY_SUBJECTS,
        f"the subject filters match more than {MAX_MULTI_SUBJECTS} subjects: narrow the "
        "filters, or list the subjects (keys) explicitly",
    )


def _not_allowed(stream: str) -> errors.GatewayError:
    return errors.DirectNotAllowed(
        detail=f"stream {stream!r} does not allow Direct Get (allow_direct is false); "
        "enable it, or read with consistency=leader",
    )


def _status_error(status: int, description: str) -> errors.GatewayError:
    if status == 404:
        return errors.MessageNotFound(detail="no message matches the request")
    if status == 413:
        return too_many_subjects()
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
