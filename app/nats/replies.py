"""Request/reply read straight off the connection, for every request the gateway makes.

nats-py answers a request through its generic message path: a random token per request (read
from the kernel's random source), a header block parsed into a folded dict, a ``Msg`` object,
a hop through the reply subscription's queue and task, and ``asyncio.wait_for``. For a single
Direct Get that was a fifth of a KV read's cost. :class:`LeanClient` is nats-py's client with
one addition: messages of a subscription registered with :meth:`LeanClient.raw_subscribe` go to
a plain callback with their raw header block and payload. :class:`ReplyMux` uses that for
request/reply: one wildcard inbox per connection, a counter as token, deadlines kept in
buckets of 50 ms with one timer per bucket (a timer per request cost more than the rest of
the request's bookkeeping; a request may time out up to 50 ms late), and the raw header block
parsed once, when it is read (keeping repeated header names, which nats-py folds). A
request's PUB is queued for nats-py's flusher directly (:meth:`LeanClient.publish_queued`)
when the connection is plainly up, skipping four coroutine layers of ``publish``; in every
other state nats-py's ``publish`` does it, with its own errors and buffering. The messages of
an atomic batch are queued together (:meth:`LeanClient.publish_all_queued`, the same private
names: ``_pending``, ``_pending_data_size``, ``_flush_queue``, ``_flusher_task``,
``_status``), so that nothing can stop the batch half-way.

Requests answered by many replies (Direct Get batches) get an inbox of their own,
:class:`RawInbox` (:meth:`LeanClient.raw_inbox`), whose replies go to the caller's callback
raw, the same way.

Messages are read off the socket by :class:`app.nats.wire.LeanParser`, which hands those of raw
subscriptions to their callbacks directly. Everything else (connecting, reconnecting and
re-subscribing, auth, TLS, flushing, subscriptions of consumers) is still nats-py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable

import nats.errors
from nats.aio.subscription import Subscription

from app.compat import NatsClient, subscription_id
from app.nats.headers import HeaderBlock, parse
from app.nats.pull import unsubscribe
from app.nats.wire import LeanParser

RawHandler = Callable[[bytes, bytes, bytes], None]
Settled = Callable[["Reply"], bool]
"""Whether a write's reply says it was stored (a PubAck), as opposed to a refusal."""

log = logging.getLogger("jsgw.replies")

# What nats-py's publish refuses in a subject: a space, tab, CR or LF would split the command.
_SUBJECT_INVALID = re.compile(r"[ \t\r\n]")
_TICK = 0.05  # seconds: requests' deadlines are kept in buckets this wide
# Seconds an answered write's token stays known, so that a second answer to it is counted as
# such (JetStream answers one publish twice after a partition: see request_write).
_ANSWERED_WATCH = 1.0
_LOG_EVERY = 1.0  # seconds: at most one log line this often about extra replies
_SILENCE_TICK = 0.5  # seconds between checks that a connection with requests waiting answers


_NO_STATUS = b"NATS/1.0\r\n"  # a header block whose status line carries no status


class Reply:
    """A reply: its payload and header block (``raw_headers``, parsed on first use)."""

    __slots__ = ("_block", "data", "raw_headers")

    def __init__(self, raw_headers: bytes | None, data: bytes) -> None:
        self.raw_headers = raw_headers
        self.data = data
        self._block: HeaderBlock | None = None

    @property
    def headers(self) -> HeaderBlock:
        block = self._block
        if block is None:
            block = self._block = parse(self.raw_headers)
        return block

    @property
    def status(self) -> int | None:
        raw = self.raw_headers
        if not raw or raw.startswith(_NO_STATUS):
            return None
        return self.headers.status


class LeanClient(NatsClient):
    def __init__(self) -> None:
        super().__init__()
        self._ps = LeanParser(self)
        self._raw_handlers: dict[int, RawHandler] = {}
        self.replies = ReplyMux(self)

    async def flush_in_order(self, timeout: float) -> None:
        """Until the server has processed everything this client has sent or queued so far.

        nats-py's ``flush`` writes its PING straight to the socket, ahead of the commands that
        wait in ``_pending`` for its flusher task (a SUB just made): its PONG can come back
        before the server has seen that SUB. A subscription made and "flushed" so then missed
        other connections' messages for a moment (50 of 300 requests to a responder
        subscribed and flushed just before were answered "no responders", nats-py 2.16,
        nats-server 2.15.1). What is queued is handed to the flusher, and waited for, first."""
        if self._pending:
            await self._flush_pending(force_flush=True)
        await self.flush(max(1, math.ceil(timeout)))

    async def raw_subscribe(
        self, subject: str, handler: RawHandler, queue: str = ""
    ) -> Subscription:
        """``handler(subject, header_block, payload)`` gets every message of the subject (of
        those the server gives this member of ``queue``, with one)."""
        sub = await self.subscribe(subject, queue=queue)
        self._raw_handlers[subscription_id(sub)] = handler
        return sub

    async def raw_unsubscribe(self, sub: Subscription) -> None:
        """End a subscription of :meth:`raw_subscribe` (a connection that is already gone
        took it along)."""
        try:
            await unsubscribe(sub)
        finally:
            self._raw_handlers.pop(subscription_id(sub), None)

    async def raw_inbox(self, handler: RawHandler) -> RawInbox:
        """A new inbox of its own whose replies go to ``handler`` raw."""
        subject = self.new_inbox()
        return RawInbox(self, subject, await self.raw_subscribe(subject, handler))

    def publish_queued(self, subject: str, reply: str, payload: bytes) -> bool:
        """Queue a PUB for the flusher as nats-py's ``publish`` would, in one step; False, with
        nothing queued, unless the connection is up with its flusher running and room in its
        buffer (then ``publish`` itself must be used: it buffers, flushes or raises)."""
        size = len(payload)
        queue = self._flush_queue
        flusher = self._flusher_task
        if (
            self._status != NatsClient.CONNECTED
            or queue is None
            or queue.full()
            or flusher is None
            or flusher.done()
            or size > self._max_payload
            or not subject
            or _SUBJECT_INVALID.search(subject) is not None
        ):
            return False
        command = b"PUB %b %b %d\r\n%b\r\n" % (subject.encode(), reply.encode(), size, payload)
        if 0 < self._max_pending_size < self._pending_data_size + len(command):
            return False
        self._pending.append(command)
        self._pending_data_size += len(command)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += size
        if queue.empty():
            queue.put_nowait(flusher.get_loop().create_future())  # wakes the flusher
        return True

    def publish_all_queued(self, commands: list[bytes], payload_bytes: int) -> bool:
        """Queue many PUB/HPUB commands for the flusher together, with nothing awaited in
        between, so that either all of them go out in order or (False) none: the connection
        is not up with its flusher running (nothing is buffered while it is down)."""
        queue = self._flush_queue
        flusher = self._flusher_task
        if (
            self._status != NatsClient.CONNECTED
            or queue is None
            or flusher is None
            or flusher.done()
        ):
            return False
        self._pending.extend(commands)
        self._pending_data_size += sum(map(len, commands))
        self.stats["out_msgs"] += len(commands)
        self.stats["out_bytes"] += payload_bytes
        if queue.empty():
            queue.put_nowait(flusher.get_loop().create_future())  # wakes the flusher
        return True

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handler = self._raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
        else:
            handler(subject, headers, data)


class RawInbox:
    """An inbox of its own on one connection, its replies handed to a callback raw (header
    block and payload, as read): for requests answered by many replies (Direct Get batches),
    which the reply mux's one-reply-per-token routing does not fit."""

    __slots__ = ("_sub", "client", "subject")

    def __init__(self, client: LeanClient, subject: str, sub: Subscription) -> None:
        self.client = client
        self.subject = subject
        self._sub: Subscription | None = sub

    async def request(self, subject: str, payload: bytes) -> None:
        """Send a request whose replies come to this inbox."""
        await self.client.publish(subject, payload, reply=self.subject)

    async def close(self) -> None:
        """Unsubscribe (a connection that is already gone took the subscription along)."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        try:
            await unsubscribe(sub)
        finally:
            self.client._raw_handlers.pop(subscription_id(sub), None)


class RawSubscription:
    """A subscription of :meth:`LeanClient.raw_subscribe` for as long as a caller keeps it
    (a core NATS subscriber's stream): :meth:`close` ends it, once."""

    __slots__ = ("_closing", "client", "sub")

    def __init__(self, client: LeanClient, sub: Subscription) -> None:
        self.client = client
        self.sub = sub
        self._closing: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """False once its connection is closed for good (the pool replaces such a one, and
        the subscription is not carried over)."""
        return not self.client.is_closed

    def close_soon(self) -> asyncio.Task[None]:
        """Start the unsubscribe (from a plain callback); the same task on every call."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        return self._closing

    async def close(self) -> None:
        await asyncio.shield(self.close_soon())

    async def _close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self.client.raw_unsubscribe(self.sub)


def header_block(headers: dict[str, str]) -> bytes:
    """A message's header block as nats-py's ``publish`` writes it (names and values
    stripped; both checked by the caller: no CR, LF or ':' in a name)."""
    block = "NATS/1.0\r\n" + "".join(f"{k.strip()}: {v.strip()}\r\n" for k, v in headers.items())
    return (block + "\r\n").encode()


def hpub(subject: str, reply: str, head: bytes, payload: bytes) -> bytes:
    """The HPUB command of a message with the header block ``head``."""
    size = len(head)
    return b"HPUB %b %b %d %d\r\n%b%b\r\n" % (
        subject.encode(),
        reply.encode(),
        size,
        size + len(payload),
        head,
        payload,
    )


class ConnectionLost(nats.errors.TimeoutError):
    """The connection broke while a request was waiting for its reply: it was sent (a write's
    outcome is unknown), and no reply can come on that connection any more."""


def _expire(futures: set[asyncio.Future[Reply]]) -> int:
    expired = 0
    for future in futures:
        if not future.done():
            future.set_exception(nats.errors.TimeoutError())
            expired += 1
    return expired


class _WriteReplies:
    """The replies to a write's tokens that its first reply did not take, as they come."""

    __slots__ = ("answered", "lost", "replies", "seen", "waiter")

    def __init__(self, token: bytes) -> None:
        self.answered = {token}  # the write's tokens answered so far (the first, at start)
        self.lost = False  # the connection broke while the write waited
        self.replies: list[tuple[bytes, Reply]] = []
        self.seen = 0  # replies the write has looked at
        self.waiter: asyncio.Future[None] | None = None

    def add(self, token: bytes, reply: Reply) -> None:
        self.replies.append((token, reply))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class ReplyMux:
    """Requests whose replies come back on one wildcard inbox of the connection."""

    def __init__(self, client: LeanClient) -> None:
        self.client = client
        self._prefix = ""
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._next = 0
        self._started: asyncio.Task[None] | None = None
        # The connection's loop, set by _start (asking for the running loop on every request
        # showed in the profile of a KV read).
        self._loop: asyncio.AbstractEventLoop
        self._deadlines: dict[int, set[asyncio.Future[Reply]]] = {}  # by bucket (see _TICK)
        self._writes: dict[bytes, _WriteReplies] = {}  # writes in progress, by token
        self._answered: dict[bytes, str] = {}  # answered writes' tokens: their subjects
        self._answered_order: deque[tuple[float, bytes]] = deque()  # (watched until, token)
        # Replies no request waits for: "second" (to a write already answered), "late" (after
        # its request timed out or stopped watching); on_extra_reply is told of each.
        self.extra_replies = {"second": 0, "late": 0}
        self.on_extra_reply: Callable[[str], None] | None = None
        # Told when requests time out, or wait while no reply comes at all, so the pool can
        # check the connection is alive (see _watch_silence).
        self.on_timeout: Callable[[], None] | None = None
        self.replies_seen = 0
        self._seen_at_tick = 0
        self._silent_ticks = 0
        self._logged_at = -_LOG_EVERY
        self._unlogged = 0

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        prefix = self.client.new_inbox() + "."
        await self.client.raw_subscribe(prefix + "*", self._on_reply)
        self._prefix = prefix
        self._loop.call_later(_SILENCE_TICK, self._watch_silence)

    def _watch_silence(self) -> None:
        """Every tick: requests waiting, and not one reply since the last tick, two ticks in a
        row, make the connection suspect (``on_timeout``): a server that answers nothing
        while requests wait is probed within a second or so, long before they time out."""
        if self.client.is_closed:
            return
        waiting = bool(self._pending or self._writes)
        if waiting and self.replies_seen == self._seen_at_tick:
            self._silent_ticks += 1
            if self._silent_ticks >= 2:
                self._silent_ticks = 0
                self._timed_out()
        else:
            self._silent_ticks = 0
        self._seen_at_tick = self.replies_seen
        self._loop.call_later(_SILENCE_TICK, self._watch_silence)

    async def _ready(self) -> None:
        if not self._prefix:
            if self._started is None:
                self._started = asyncio.ensure_future(self._start())
            await asyncio.shield(self._started)

    def _register(self) -> tuple[bytes, asyncio.Future[Reply], str]:
        """A new request's token, the future its reply will settle, and its reply subject."""
        self._next += 1
        token = b"%x" % self._next
        future: asyncio.Future[Reply] = self._loop.create_future()
        self._pending[token] = future
        return token, future, self._prefix + token.decode()

    def _deadline(
        self, loop: asyncio.AbstractEventLoop, timeout: float
    ) -> set[asyncio.Future[Reply]]:
        """The set of futures that time out at the end of the bucket ``timeout`` from now
        falls in; the caller adds its futures and discards them when they are answered."""
        bucket = math.ceil((loop.time() + timeout) / _TICK)
        futures = self._deadlines.get(bucket)
        if futures is None:
            futures = self._deadlines[bucket] = set()
            loop.call_at(bucket * _TICK, self._expire_bucket, bucket)
        return futures

    def _expire_bucket(self, bucket: int) -> None:
        if _expire(self._deadlines.pop(bucket, set())):
            self._timed_out()

    def _timed_out(self) -> None:
        if self.on_timeout is not None:
            self.on_timeout()

    def fail_pending(self) -> None:
        """The connection broke: every request waiting for a reply ends now (ConnectionLost),
        rather than at its timeout."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionLost())
        for write in self._writes.values():
            write.lost = True
            if write.waiter is not None and not write.waiter.done():
                write.waiter.set_result(None)

    async def request(
        self,
        subject: str,
        payload: bytes,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """The reply; nats-py's NoRespondersError / TimeoutError as its own request raises."""
        if not self._prefix:
            await self._ready()
        token, future, reply_to = self._register()
        deadline = self._deadline(self._loop, timeout)
        deadline.add(future)
        try:
            if headers is not None or not self.client.publish_queued(subject, reply_to, payload):
                await self.client.publish(subject, payload, reply=reply_to, headers=headers)
            reply = await future
        finally:
            deadline.discard(future)
            self._pending.pop(token, None)
        if reply.status == 503 and not reply.data:
            raise nats.errors.NoRespondersError
        return reply

    async def request_all(
        self, requests: list[tuple[str, bytes]], timeout: float
    ) -> list[Reply | Exception]:
        """Many requests sent together, one deadline for all: a reply each, or the exception
        its own request would have raised (NoRespondersError, TimeoutError)."""
        await self._ready()
        tokens: list[bytes] = []
        futures: list[asyncio.Future[Reply]] = []
        try:
            for subject, payload in requests:
                token, future, reply_to = self._register()
                tokens.append(token)
                futures.append(future)
                if not self.client.publish_queued(subject, reply_to, payload):
                    await self.client.publish(subject, payload, reply=reply_to)
            if futures:
                # The server answers a connection's requests in order, so once the last one
                # is answered the others normally are too: one waiter for it, then one for
                # any still open (not one callback per future on every batch).
                ends = self._loop.time() + timeout
                await asyncio.wait((futures[-1],), timeout=timeout)
                open_ = [future for future in futures if not future.done()]
                if open_:
                    await asyncio.wait(open_, timeout=max(0.0, ends - self._loop.time()))
        finally:
            for token in tokens:
                self._pending.pop(token, None)
        results: list[Reply | Exception] = []
        if not all(future.done() for future in futures):
            self._timed_out()
        for future in futures:
            if not future.done():
                future.cancel()
                results.append(nats.errors.TimeoutError())
            elif future.exception() is not None:
                results.append(ConnectionLost())
            elif (reply := future.result()).status == 503 and not reply.data:
                results.append(nats.errors.NoRespondersError())
            else:
                results.append(reply)
        return results

    async def request_batch(
        self, messages: list[tuple[str, dict[str, str], bytes]], timeout: float
    ) -> list[Reply | None]:
        """Requests (subject, headers, payload) queued for the connection in one step (all or
        none: :meth:`LeanClient.publish_all_queued`), so no cancellation of the caller can
        leave some sent and the rest not; then the reply of the last one, awaited up to
        ``timeout`` (nats-py's TimeoutError, or ConnectionLost, otherwise; MaxPayloadError,
        with nothing sent, when a message is over the connection's max_payload). Returns the
        reply of each, None for those that have not come by then (their order on the
        connection is the order of the requests, so they normally have)."""
        # The server closes a connection that sends a message over its max_payload (headers
        # and payload together), failing every request waiting on it: refuse the whole batch
        # first, as nats-py's publish refuses one message (it is not asked here).
        heads = [header_block(headers) for _, headers, _ in messages]
        limit = self.client.max_payload
        if any(len(head) + len(m[2]) > limit for head, m in zip(heads, messages, strict=True)):
            raise nats.errors.MaxPayloadError
        if not self._prefix:
            await self._ready()
        registered = [self._register() for _ in messages]
        try:
            commands = [
                hpub(subject, reply_to, head, payload)
                for (subject, _, payload), head, (_, _, reply_to) in zip(
                    messages, heads, registered, strict=True
                )
            ]
            if not self.client.publish_all_queued(commands, sum(len(m[2]) for m in messages)):
                raise nats.errors.ConnectionReconnectingError
            last = registered[-1][1]
            deadline = self._deadline(self._loop, timeout)
            deadline.add(last)
            try:
                await last
            finally:
                deadline.discard(last)
        finally:
            replies: list[Reply | None] = []
            for token, future, _ in registered:
                self._pending.pop(token, None)
                # (an exception of one, the connection lost, is retrieved here: that of the
                # last one is the caller's)
                if future.done() and not future.cancelled() and future.exception() is None:
                    replies.append(future.result())
                else:
                    future.cancel()
                    replies.append(None)
        return replies

    def _on_reply(self, subject: bytes, headers: bytes, data: bytes) -> None:
        self.replies_seen += 1
        token = subject[subject.rfind(b".") + 1 :]
        future = self._pending.pop(token, None)
        if future is not None and not future.done():
            future.set_result(Reply(headers, data))
            return
        write = self._writes.get(token)
        if write is not None:
            write.add(token, Reply(headers, data))
        elif token in self._answered:
            self._extra("second", self._answered[token])
        else:
            self._extra("late", None)

    # -- writes ----------------------------------------------------------------------------

    async def request_write(
        self,
        subject: str,
        payload: bytes,
        timeout: float,
        headers: dict[str, str] | None,
        stored: Settled,
        *,
        grace: float,
        resend: bool,
    ) -> Reply:
        """A write's reply, believing a refusal only when nothing contradicts it.

        After a partition heals, a deposed stream leader that has not yet learnt it lost its
        leadership still holds the stream's subscription: it refuses a conditional write
        against its stale state while the new leader stores the same write and acknowledges
        it, and the two answers come back milliseconds apart in either order. So a refusal
        (a reply ``stored`` says is no PubAck) does not settle a write at once. With ``resend``
        (a write carrying a ``Nats-Msg-Id``, which the stream deduplicates) the write is sent a
        second time: a copy of a stored write is answered as a duplicate with its sequence,
        one that was not stored is judged anew. Then, once every attempt has been answered,
        the write waits ``grace`` seconds more for a PubAck on any of its tokens. The first
        PubAck wins; otherwise the latest refusal is returned. An attempt left unanswered
        ``timeout`` seconds after the write was first sent raises TimeoutError: whether the
        write is stored is unknown.
        """
        if not self._prefix:
            await self._ready()
        token, future, reply_to = self._register()
        collector = self._writes[token] = _WriteReplies(token)
        tokens = [token]
        ends = self._loop.time() + timeout
        deadline = self._deadline(self._loop, timeout)
        deadline.add(future)
        try:
            try:
                await self._send(subject, payload, headers, reply_to)
                reply = await future
            finally:
                deadline.discard(future)
                self._pending.pop(token, None)
            if reply.status == 503 and not reply.data:
                raise nats.errors.NoRespondersError
            if stored(reply):
                return reply
            return await self._confirm(
                subject, payload, headers, stored, reply, collector, tokens, ends, grace, resend
            )
        finally:
            self._settled(subject, tokens, collector)

    async def _confirm(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None,
        stored: Settled,
        refusal: Reply,
        collector: _WriteReplies,
        tokens: list[bytes],
        ends: float,
        grace: float,
        resend: bool,
    ) -> Reply:
        loop = self._loop
        answered = collector.answered
        if resend:
            self._next += 1
            token = b"%x" % self._next
            self._writes[token] = collector
            tokens.append(token)
            await self._send(subject, payload, headers, self._prefix + token.decode())
        held_until: float | None = None
        while True:
            if collector.lost:
                raise ConnectionLost
            while collector.seen < len(collector.replies):
                token, reply = collector.replies[collector.seen]
                collector.seen += 1
                if token in answered:
                    self._extra("second", subject)
                answered.add(token)
                if stored(reply):
                    return reply
                if reply.status != 503 or reply.data:  # "no responders" refuses nothing
                    refusal = reply
            if held_until is None and len(answered) == len(tokens):
                held_until = min(loop.time() + grace, ends)
            left = (held_until or ends) - loop.time()
            if left <= 0:
                if held_until is None:
                    self._timed_out()
                    raise nats.errors.TimeoutError
                return refusal
            collector.waiter = waiter = loop.create_future()
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                pass
            finally:
                collector.waiter = None

    async def _send(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, reply_to: str
    ) -> None:
        if headers is not None or not self.client.publish_queued(subject, reply_to, payload):
            await self.client.publish(subject, payload, reply=reply_to, headers=headers)

    def _settled(self, subject: str, tokens: list[bytes], collector: _WriteReplies) -> None:
        """A write is answered: the tokens that were are watched a while longer for second
        replies (a resent copy's first reply, should it come later, is only late)."""
        for token, _ in collector.replies[collector.seen :]:
            if token in collector.answered:
                self._extra("second", subject)
            collector.answered.add(token)
        collector.seen = len(collector.replies)
        now = self._loop.time()
        answered = self._answered
        order = self._answered_order
        for token in tokens:
            del self._writes[token]
            if token in collector.answered:
                answered[token] = subject
                order.append((now + _ANSWERED_WATCH, token))
        while order and order[0][0] <= now:
            answered.pop(order.popleft()[1], None)

    def _extra(self, kind: str, subject: str | None) -> None:
        self.extra_replies[kind] += 1
        if self.on_extra_reply is not None:
            self.on_extra_reply(kind)
        if kind != "second":
            return
        now = time.monotonic()
        if now - self._logged_at < _LOG_EVERY:
            self._unlogged += 1
            return
        log.warning(
            "a write to %s was answered twice: two servers answer for one stream (a deposed "
            "leader after a partition?); %d more such replies since the last line",
            subject,
            self._unlogged,
        )
        self._logged_at = now
        self._unlogged = 0
