"""A minimal asyncio HTTP/1.1 keep-alive client on httptools' C parser.

The load processes use it instead of httpx/aiohttp so that the client adds as little as
possible to what is measured: requests are pre-built bytes, one request in flight per
connection, the body goes to a buffer or to a sink callback (streams, SSE).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

import httptools


class HTTPError(Exception):
    pass


class Connection(asyncio.Protocol):
    def __init__(self, host: str) -> None:
        self.host = host.encode()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.sink: Callable[[bytes], None] | None = None
        self.on_headers: Callable[[int], None] | None = None
        self.chunks: list[bytes] = []
        self.status = 0
        self.closed: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: cls(f"{host}:{port}"), host, port)
        conn.closed = loop.create_future()
        return conn

    # -- protocol ---------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPError(f"bad response: {exc}"))
            if self.transport:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(HTTPError(f"connection lost: {exc}"))
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    # -- parser callbacks -------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.on_headers is not None:
            self.on_headers(self.status)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink(body)
        else:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks)
        self.chunks = []
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.status, body))

    # -- API --------------------------------------------------------------------------------
    def build(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host.decode()}"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")

    async def send(
        self,
        raw: bytes,
        sink: Callable[[bytes], None] | None = None,
        on_headers: Callable[[int], None] | None = None,
    ) -> tuple[int, bytes]:
        """Send a pre-built request; the answer's status and body (empty when sunk)."""
        assert self.transport is not None
        if self.transport.is_closing():
            raise HTTPError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.sink = sink
        self.on_headers = on_headers
        self.transport.write(raw)
        return await self.waiter

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        sink: Callable[[bytes], None] | None = None,
    ) -> tuple[int, bytes]:
        return await self.send(self.build(method, path, body, headers), sink)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
