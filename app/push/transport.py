"""The HTTP/1.1 transport under the deliveries' ``httpx.AsyncClient``.

httpx's own transport (httpcore over anyio, with h11 as the parser) took about 3 ms of CPU
per POST of a push delivery, nine tenths of the gateway's work per message, and its pool
looks at every connection for every request, so that with hundreds of POSTs out at once the
event loop stalled for seconds. This transport is httpx's extension point
(``httpx.AsyncBaseTransport``) done with what the gateway already runs on: asyncio's
protocols, and httptools (uvicorn's parser) for the answers. A POST costs about a tenth.

What it does: one request at a time per connection, the connections of an origin kept for
the next request (the last used first), HTTP/1.1 keep-alive as the answer says, TLS for
``https://`` with the default context (certificates verified). What it leaves to httpx:
building the request (``Host``, ``Content-Length``), the response object, and redirects,
which the client is told not to follow. Timeouts are the caller's (a cancelled request
closes its connection). An answer's body is read whole, up to ``max_body`` bytes: past it
the connection is closed and :class:`AnswerTooLarge` raised.

A connection idle for :data:`IDLE` seconds is not used again: servers close idle ones
(uvicorn after 5 s, nginx after 75 s), and one closed while a request goes out on it would
fail that request.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import cast

import httptools
import httpx

IDLE = 2.0
MAX_IDLE_PER_ORIGIN = 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class AnswerTooLarge(httpx.RemoteProtocolError):
    """The answer's body is longer than the transport reads."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request, then its answer, then maybe another."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._answer: asyncio.Future[httpx.Response] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._headed = self._keep = self._delimited = False

    # asyncio's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are asyncio's in all but their class)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"not an HTTP/1.1 answer: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headed and not self._delimited:
            # An answer with neither a length nor chunks ends with its connection.
            self._complete()
            return
        self._fail(httpx.ReadError("the connection closed before the whole answer came"))

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self._headed = True

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._max_body:
            self._fail(AnswerTooLarge(f"the answer is longer than {self._max_body} bytes"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        # (httptools tells keep-alive while it is at the message's end, not after)
        self._keep = self._parser.should_keep_alive()
        self._complete()

    # use

    async def exchange(self, head: bytes, body: bytes) -> httpx.Response:
        assert self.transport is not None
        self._headers, self._body, self._size = [], [], 0
        self._headed = self._keep = self._delimited = False
        answer: asyncio.Future[httpx.Response] = asyncio.get_running_loop().create_future()
        self._answer = answer
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        try:
            return await answer
        finally:
            self._answer = None
            if not answer.done() or answer.cancelled() or answer.exception() is not None:
                self.close()

    def reusable(self) -> bool:
        return not self.closed and self._keep

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _complete(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            status = self._parser.get_status_code()
            answer.set_result(
                httpx.Response(status, headers=self._headers, content=b"".join(self._body))
            )

    def _fail(self, error: Exception) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(error)
        self.close()


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        port = url.port or _DEFAULT_PORTS[scheme]
        origin = (scheme, url.host, port)
        connection = self._reuse(origin) or await self._connect(origin)
        lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)]
        lines += [name + b": " + value + b"\r\n" for name, value in request.headers.raw]
        lines.append(b"\r\n")
        body = await request.aread()  # (in memory already: the runner's requests are bytes)
        try:
            response = await connection.exchange(b"".join(lines), body)
        finally:
            self._open.discard(connection)
        if connection.reusable():
            connection.idle_since = time.monotonic()
            idle = self._idle.setdefault(origin, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                idle.append(connection)
                self._open.add(connection)
            else:
                connection.close()
        else:
            connection.close()
        response.request = request
        return response

    def _reuse(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE:
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            context = self._tls
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(self._max_body),
                host,
                port,
                ssl=context,
                server_hostname=host if context is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        self._open.add(connection)
        return connection

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()
