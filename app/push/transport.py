"""The HTTP/1.1 client of push deliveries: a POST, its answer, connections kept per origin.

The deliveries first went through httpx: its own transport (httpcore over anyio, h11 as the
parser) took about 3 ms of CPU per POST, nine tenths of the gateway's work per message, and
its pool looked at every connection for every request, so that with hundreds of POSTs out
the event loop stalled for seconds; with a transport of asyncio protocols under it, the
client's request and response objects (cookies, URL merging, header normalisation) were
still a quarter of the gateway's CPU per message. A delivery needs one thing: POST these
bytes to this URL, and read the status, the headers and a bounded body. This module does
that with what the gateway already runs on: asyncio's protocols, and httptools (uvicorn's
parser) for the answers.

What it does: one request at a time per connection; the connections of an origin kept for
the next request (the last used first); HTTP/1.1 keep-alive as the answer says; TLS for
``https://`` with certificates verified against the system's CA certificates, or those of
``ca_file`` (``JSGW_PUSH_CA``). Redirects are answers like
any other (never followed), no proxy is used, no cookie kept. Timeouts are the caller's (a
cancelled request closes its connection). An answer's body is read whole, up to
``max_body`` bytes: past it the connection is closed and :class:`AnswerTooLarge` raised.

A connection idle for :data:`IDLE` seconds is not used again: servers close idle ones
(uvicorn after 5 s, nginx after 75 s). One that a server closed all the same as a request
went out on it (it had closed it before reading the request: nothing of an answer came) is
replaced by a new connection and the request sent once more: the application has not seen
it, and if it had, a delivery is at least once and carries its de-duplication key.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

import httptools

from app.push.allowlist import http_url

IDLE = 2.0
MAX_IDLE_PER_ORIGIN = 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class TransportError(Exception):
    """The request got no complete HTTP answer."""


class ConnectFailed(TransportError):
    """No connection to the endpoint (refused, unreachable, TLS refused)."""


class ConnectionBroke(TransportError):
    """The connection closed before the whole answer came."""


class NotHttp(TransportError):
    """What came back is not an HTTP/1.1 answer."""


class AnswerTooLarge(TransportError):
    """The answer's body is longer than the client reads."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A URL, parsed once: where to connect, and the request line's target."""

    scheme: str
    host: str
    port: int
    target: bytes
    authority: bytes

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parsed by httpx's URL parser, the one the allow-list checks the same URL with."""
        parsed = http_url(url)
        port = parsed.port or _DEFAULT_PORTS[parsed.scheme]
        return cls(parsed.scheme, parsed.host, port, parsed.raw_path, parsed.netloc)

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    """By lower-case name; the values of a repeated field joined with ``", "``."""
    body: bytes


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in raw:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        found[key] = f"{found[key]}, {text}" if key in found else text
    return found


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request, then its answer, then maybe another."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False
        """It has carried a request before the one under way."""
        self.heard = False
        """Something of the answer under way has come."""
        self._answer: asyncio.Future[Answer] | None = None
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
        self.heard = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(NotHttp(f"not an HTTP/1.1 answer: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headed and not self._delimited:
            # An answer with neither a length nor chunks ends with its connection.
            self._complete()
            return
        self._fail(ConnectionBroke("the connection closed before the whole answer came"))

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

    async def exchange(self, request: bytes) -> Answer:
        assert self.transport is not None
        self._headers, self._body, self._size = [], [], 0
        self._headed = self._keep = self._delimited = self.heard = False
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._answer = answer
        self.transport.write(request)
        try:
            return await answer
        finally:
            self._answer = None
            self.used = True
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
            answer.set_result(Answer(status, _headers(self._headers), b"".join(self._body)))

    def _fail(self, error: Exception) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(error)
        self.close()


class Client:
    """POSTs, with the connections of each origin kept between them."""

    def __init__(
        self,
        max_body: int,
        fixed_headers: Iterable[tuple[str, str]] = (),
        ca_file: str | None = None,
    ) -> None:
        self._max_body = max_body
        # Made now when the CA file is given, so that a file that is not PEM certificates
        # stops the start-up rather than every delivery.
        self._tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._fixed = b"".join(_field(name, value) for name, value in fixed_headers)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def post(
        self, endpoint: Endpoint, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Answer:
        """POST ``body`` with ``headers`` (each a valid field: the caller's to check) besides
        ``Host``, ``Content-Length`` and the client's fixed ones."""
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            endpoint.target,
            endpoint.authority,
            len(body),
        )
        fields = b"".join(_field(name, value) for name, value in headers)
        request = b"".join((head, fields, self._fixed, b"\r\n", body))
        origin = endpoint.origin
        connection = self._reuse(origin)
        if connection is not None:
            try:
                return await self._exchange(origin, connection, request)
            except ConnectionBroke:
                if connection.heard:
                    raise
                # closed by the server as the request went out: once more, on a new one
        return await self._exchange(origin, await self._connect(origin), request)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    async def _exchange(
        self, origin: tuple[str, str, int], connection: _Connection, request: bytes
    ) -> Answer:
        try:
            answer = await connection.exchange(request)
        finally:
            self._open.discard(connection)
        idle = self._idle.setdefault(origin, [])
        if connection.reusable() and len(idle) < MAX_IDLE_PER_ORIGIN:
            connection.idle_since = time.monotonic()
            idle.append(connection)
            self._open.add(connection)
        else:
            connection.close()
        return answer

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
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        self._open.add(connection)
        return connection


def _field(name: str, value: str) -> bytes:
    return b"%s: %s\r\n" % (name.encode("ascii"), value.encode())
