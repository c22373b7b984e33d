"""Request/reply read straight off the connection, for every request the gateway makes.

nats-py answers a request through its generic message path: a random token per request (read
from the kernel's random source), a header block parsed into a folded dict, a ``Msg`` object,
a hop through the reply subscription's queue and task, and ``asyncio.wait_for``. For a single
Direct Get that was a fifth of a KV read's cost. :class:`LeanClient` is nats-py's client with
one addition: messages of a subscription registered with :meth:`LeanClient.raw_subscribe` go to
a plain callback with their raw header block and payload. :class:`ReplyMux` uses that for
request/reply: one wildcard inbox per connection, a counter as token, a timer per request (one
per batch for :meth:`ReplyMux.request_all`), and the raw header block parsed once (keeping
repeated header names, which nats-py folds).

Everything else (connecting, reconnecting and re-subscribing, auth, TLS, flushing,
subscriptions of consumers) is still nats-py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client

from app.nats.headers import HeaderBlock, parse

RawHandler = Callable[[bytes, bytes, bytes], None]


class Reply:
    __slots__ = ("data", "headers")

    def __init__(self, headers: HeaderBlock, data: bytes) -> None:
        self.headers = headers
        self.data = data

    @property
    def status(self) -> int | None:
        return self.headers.status


class LeanClient(Client):
    def __init__(self) -> None:
        super().__init__()
        self._raw_handlers: dict[int, RawHandler] = {}
        self.replies = ReplyMux(self)

    async def raw_subscribe(self, subject: str, handler: RawHandler) -> None:
        """``handler(subject, header_block, payload)`` gets every message of the subject."""
        sub = await self.subscribe(subject)
        self._raw_handlers[sub._id] = handler

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handler = self._raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
        else:
            handler(subject, headers, data)


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


class ReplyMux:
    """Requests whose replies come back on one wildcard inbox of the connection."""

    def __init__(self, client: LeanClient) -> None:
        self.client = client
        self._prefix = ""
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._next = 0
        self._started: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        prefix = self.client.new_inbox() + "."
        await self.client.raw_subscribe(prefix + "*", self._on_reply)
        self._prefix = prefix

    async def _ready(self) -> None:
        if not self._prefix:
            if self._started is None:
                self._started = asyncio.ensure_future(self._start())
            await asyncio.shield(self._started)

    async def request(
        self,
        subject: str,
        payload: bytes,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """The reply; nats-py's NoRespondersError / TimeoutError as its own request raises."""
        await self._ready()
        self._next += 1
        token = b"%x" % self._next
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[token] = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self.client.publish(
                subject, payload, reply=self._prefix + token.decode(), headers=headers
            )
            reply = await future
        finally:
            timer.cancel()
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
        loop = asyncio.get_running_loop()
        tokens: list[bytes] = []
        futures: list[asyncio.Future[Reply]] = []
        try:
            for subject, payload in requests:
                self._next += 1
                token = b"%x" % self._next
                future: asyncio.Future[Reply] = loop.create_future()
                self._pending[token] = future
                tokens.append(token)
                futures.append(future)
                await self.client.publish(subject, payload, reply=self._prefix + token.decode())
            if futures:
                await asyncio.wait(futures, timeout=timeout)
        finally:
            for token in tokens:
                self._pending.pop(token, None)
        results: list[Reply | Exception] = []
        for future in futures:
            if not future.done():
                future.cancel()
                results.append(nats.errors.TimeoutError())
            elif (reply := future.result()).status == 503 and not reply.data:
                results.append(nats.errors.NoRespondersError())
            else:
                results.append(reply)
        return results

    def _on_reply(self, subject: bytes, headers: bytes, data: bytes) -> None:
        future = self._pending.pop(subject[subject.rfind(b".") + 1 :], None)
        if future is not None and not future.done():
            future.set_result(Reply(parse(headers), data))
