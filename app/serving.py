"""The HTTP protocol the gateway serves with: uvicorn's httptools protocol, one write per tick.

uvicorn writes a response's status line and headers, then each body chunk, straight to the
socket: two ``send`` system calls (and, on the client's side, two segments to read) for the
smallest answer. A KV GET is small and frequent, so those calls were a fifth of its CPU time.
Here the transport uvicorn writes to gathers what is written during one turn of the event loop
and hands it to the socket once, at the end of that turn: a plain answer leaves in one write,
a stream's chunks leave as they did (each turn that writes, one write). Nothing waits longer
than the turn it was written in, and closing the connection sends what is gathered first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GatheringTransport:
    """An ``asyncio.Transport`` whose writes in one loop turn reach the socket as one."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        pending = self._pending
        return self._transport.get_write_buffer_size() + (sum(map(len, pending)) if pending else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatheringProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a ``GatheringTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, self.loop))  # type: ignore[arg-type]
