"""The HTTP protocol the gateway serves with: uvicorn's httptools protocol, one write per answer.

uvicorn writes a response's status line and headers, then each body chunk, straight to the
socket: two ``send`` system calls (and, on the client's side, two segments to read) for the
smallest answer. A KV GET is small and frequent, so those calls were a fifth of its CPU time.
Here the transport uvicorn writes to holds a response's head until the next write, and sends
both at once; if nothing follows in the same turn of the event loop (a stream whose first
chunk is not ready), the head leaves alone at the end of that turn (one callback per turn
flushes every connection's held head, not one per response). Every other write goes
straight to the socket as before: streams (SSE, NDJSON) are not delayed, which matters when
one change is written to thousands of watchers. Closing the connection sends a held head
first.

When the server begins to exit, a connection whose client has stopped reading (its socket
buffers full, writes paused) is cut once it has taken nothing for ``STALL_GRACE`` seconds:
closing it would wait for a flush that never comes, and uvicorn waits for every connection
to go before it stops (until its ``timeout_graceful_shutdown``, then cancelling everything
with a traceback per request). Streams end with a farewell event on shutdown; to a client
that reads nothing the farewell cannot be delivered anyway. Besides ``connection_made``,
this uses the protocol's ``shutdown``, ``resume_writing``, ``connection_lost``, ``loop``,
``flow`` (``write_paused``) and ``transport`` (app/compat.py checks them at start-up).

The garbage collector is tuned for serving (:func:`tune_gc_once_started`) by the process that
serves, once its app has started: the setting is the process's, not an app's.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from starlette.applications import Starlette

from app.compat import HttpToolsProtocol

_HEAD = b"HTTP/"  # how uvicorn's status lines begin
# Once the server exits: how long a connection with paused writes may take nothing.
STALL_GRACE = 2.0
GC_YOUNG_THRESHOLD = 10_000


class HeldHeads:
    """The transports of one event loop holding a head: flushed together at the end of the
    loop's turn."""

    __slots__ = ("_loop", "transports")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # (held weakly: the registry below is keyed by it)
        self.transports: list[GatheringTransport] = []

    def add(self, transport: GatheringTransport) -> None:
        if not self.transports:
            # (The loop is alive: the socket's transport, held by ``transport``, refers to it.)
            self._loop().call_soon(self.flush)  # type: ignore[union-attr]
        self.transports.append(transport)

    def flush(self) -> None:
        transports, self.transports = self.transports, []
        for transport in transports:
            try:
                transport.flush()
            except Exception as exc:  # noqa: BLE001 - one broken socket must not hold the others
                self._loop().call_exception_handler(  # type: ignore[union-attr]
                    {"message": "flushing a response head failed", "exception": exc}
                )


_HELD: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HeldHeads] = weakref.WeakKeyDictionary()


def _held_heads(loop: asyncio.AbstractEventLoop) -> HeldHeads:
    held = _HELD.get(loop)
    if held is None:
        held = _HELD[loop] = HeldHeads(loop)
    return held


class GatheringTransport:
    """An ``asyncio.Transport`` that sends a response's head together with what follows it."""

    __slots__ = ("_held", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._held = _held_heads(loop)
        self._pending: bytes | None = None  # a head waiting for its body

    def write(self, data: bytes) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._transport.write(pending + data)
        elif data.startswith(_HEAD):
            # (A body that happens to start so is only held until the next write or the end
            # of the turn: never reordered.)
            self._pending = bytes(data)
            self._held.add(self)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not self._transport.is_closing():
            self._transport.write(pending)

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
        return self._transport.get_write_buffer_size() + (len(pending) if pending else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatheringProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a ``GatheringTransport``; on shutdown it
    cuts a connection whose client reads nothing."""

    _stall_check: asyncio.TimerHandle | None = None
    _resumed_at = 0.0  # when the transport last took writes again

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, self.loop))  # type: ignore[arg-type]

    def resume_writing(self) -> None:
        self._resumed_at = self.loop.time()
        super().resume_writing()

    def shutdown(self) -> None:
        super().shutdown()
        if self._stall_check is None:
            self._stall_check = self.loop.call_later(STALL_GRACE, self._cut_if_stalled)

    def _cut_if_stalled(self) -> None:
        if self.flow.write_paused and self.loop.time() - self._resumed_at >= STALL_GRACE:
            self._stall_check = None
            # The request sees a disconnect (and its writer wakes from the drain): it ends.
            self.transport.abort()
        else:  # still reading, however slowly: looked at again
            self._stall_check = self.loop.call_later(STALL_GRACE, self._cut_if_stalled)

    def connection_lost(self, exc: Exception | None) -> None:
        check, self._stall_check = self._stall_check, None
        if check is not None:
            check.cancel()
        super().connection_lost(exc)


def uvicorn_options() -> dict[str, Any]:
    """The uvicorn settings the gateway is served with (by ``jsgw serve``, and by the tests'
    real server): this protocol on uvloop, no proxy headers trusted, and no ``Server``
    header (it tells anyone the server stack, and is one more header per answer)."""
    return {
        "http": GatheringProtocol,
        "loop": "uvloop",
        "proxy_headers": False,
        "server_header": False,
    }


def tune_gc() -> None:
    """Set the process's garbage collector for serving, once what lives as long as the
    process exists."""
    # What exists now (modules, the app, its schemas, its NATS pool) lives as long as the
    # process: out of the collector's sight, full collections under load (thousands of SSE
    # connections) stay short instead of pausing every stream for 0.1-0.2 s.
    gc.collect()
    gc.freeze()
    # A request frees what it allocates by reference counting (no request/response leaves a
    # cycle: tests/integration/test_garbage.py; nor does a KV watch or a batch read:
    # test_garbage_streams.py), so young collections find next to nothing to free; but at the
    # default threshold (700 allocations) the objects of 64 requests in flight set one off
    # every ~50 requests, ~4% of a KV read's CPU. At 10,000 they come when objects really
    # pile up.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


App = TypeVar("App", bound=Starlette)


def tune_gc_once_started(app: App) -> App:
    """``app`` (a Starlette app), calling :func:`tune_gc` when its lifespan has started."""
    started = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with started(app) as state:
            tune_gc()
            yield state

    app.router.lifespan_context = lifespan
    return app
