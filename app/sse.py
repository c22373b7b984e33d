"""What every SSE endpoint shares: caps on open streams, heartbeats, and a farewell event
when the gateway shuts down (so clients know to reconnect elsewhere instead of guessing)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import anyio
import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app import errors
from app.auth.policy import Principal
from app.clients import ClientAddresses
from app.compat import SseAppStatus
from app.errors import ErrorCode
from app.metrics import SSE_KINDS, Metrics
from app.tasks import cancel_and_wait

SHUTDOWN_GRACE = 2.0


class SseSlots:
    """Counts open SSE streams per client and per gateway worker. A client is its token (by
    name), or for an anonymous request its address (app.clients): without an auth file every
    request is anonymous, and one cap for all of them would be one cap for every browser.

    With ``metrics``, the open streams (by kind, one of :data:`app.metrics.SSE_KINDS`), the
    worker's cap and the refusals are exported."""

    def __init__(
        self,
        per_token: int,
        per_instance: int,
        retry_after: int,
        *,
        per_address: int | None = None,
        clients: ClientAddresses | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.per_token = per_token
        self.per_address = per_token if per_address is None else per_address
        self.per_instance = per_instance
        self.retry_after = retry_after
        self.clients = clients or ClientAddresses()
        self.by_client: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.total = 0
        self.metrics = metrics
        if metrics is not None:
            metrics.sse_streams_limit.set(per_instance)
            for kind in SSE_KINDS:
                open_streams = functools.partial(self.open_streams, kind)
                metrics.gauge_function(metrics.sse_streams_open.labels(kind), open_streams)

    def open_streams(self, kind: str) -> int:
        return self.by_kind[kind]

    def owner(self, principal: Principal, scope: Scope) -> tuple[str, int, str]:
        """Whom a stream counts against: the key, its cap, and what to call it in a 429."""
        if principal.anonymous:
            address = self.clients.of(scope)
            return f"address {address}", self.per_address, "this client address"
        return f"token {principal.name}", self.per_token, "this token"

    def acquire(
        self, principal: Principal, scope: Scope, kind: str
    ) -> Callable[[], Awaitable[None]]:
        """Take a slot for a stream of ``kind`` (429 when none is free); returns its
        idempotent release."""
        owner, cap, who = self.owner(principal, scope)
        if self.total >= self.per_instance:
            raise self._full("this gateway has too many open streams", "streams")
        if self.by_client[owner] >= cap:
            reason = "address" if principal.anonymous else "token"
            raise self._full(f"{who} has too many open streams", reason)
        self.by_client[owner] += 1
        self.by_kind[kind] += 1
        self.total += 1
        self._changed()
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.total -= 1
                self.by_kind[kind] -= 1
                self.by_client[owner] -= 1
                if self.by_client[owner] <= 0:
                    del self.by_client[owner]
                self._changed()

        return release

    def _changed(self) -> None:
        if self.metrics is not None:
            self.metrics.refresh()  # (computed gauges, with several workers)

    def _full(self, detail: str, reason: str) -> errors.TooManyRequests:
        if self.metrics is not None:
            self.metrics.sse_streams_refused.labels(reason).inc()
        return errors.TooManyRequests(
            ErrorCode.SSE_TOO_MANY_STREAMS,
            f"{detail}; close one or retry later",
            headers={"Retry-After": str(self.retry_after)},
        )


_FAREWELL = orjson.dumps(
    {"code": ErrorCode.GATEWAY_SHUTDOWN, "detail": "the gateway is shutting down; reconnect"}
).decode()


def farewell() -> ServerSentEvent:
    return ServerSentEvent(
        event="error",
        data=_FAREWELL,
    )


async def _until_shutdown(events: AsyncIterator[Any], shutdown: anyio.Event) -> AsyncIterator[Any]:
    """Pass events through; when shutdown is signalled, stop the source and say goodbye."""
    source = aiter(events)
    stop = asyncio.ensure_future(shutdown.wait())
    step: asyncio.Future[Any] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                yield farewell()
                return
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        # Also on a client disconnect, which cancels us: the source must be stopped (and so
        # stop pulling from NATS) even though the cancellation is still being delivered.
        with anyio.CancelScope(shield=True):
            stop.cancel()
            if step is not None and not step.done():
                with contextlib.suppress(StopAsyncIteration):
                    await cancel_and_wait(step)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


def sse_response(
    events: AsyncIterator[Any],
    *,
    release: Callable[[], Awaitable[None]],
    heartbeat: float,
    headers: dict[str, str] | None = None,
) -> EventSourceResponse:
    """An EventSourceResponse that gives its slot back (``release``) when it ends, and says
    goodbye with an ``error`` event when the gateway shuts down."""
    shutdown = anyio.Event()

    async def guarded() -> AsyncIterator[Any]:
        try:
            async for event in _until_shutdown(events, shutdown):
                yield event
        finally:
            await release()

    return EventSourceResponse(
        guarded(),
        # Also after a response that never started its generator (early disconnect).
        background=BackgroundTask(release),
        ping=heartbeat,
        ping_message_factory=lambda: ServerSentEvent(comment="ping"),
        headers=headers,
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE,
    )


def server_exiting() -> bool:
    """Has the HTTP server begun to exit? uvicorn waits for open streams before it stops, so
    streams must end themselves: the flag sse-starlette sets from uvicorn's signal handler, or
    uvicorn's own, found through that handler as sse-starlette does."""
    if SseAppStatus.should_exit:
        return True
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return bool(getattr(server, "should_exit", False))


class ChunkSource(Protocol):
    """What :class:`QueueStream` writes: encoded events from a queue that another task fills."""

    sending_since: float
    writer: asyncio.Task[Any] | None
    cut_off: bool

    async def next_chunk(self) -> bytes | None: ...

    def end(self) -> None: ...


# Where the application puts the server's own ``send`` (see app.main.Gateway).
RAW_SEND = "jsgw.raw_send"

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


class QueueStream(Response):
    """A text/event-stream of pre-encoded chunks, with no per-event work but the send.

    The source's queue is filled elsewhere (a fan-out feed); heartbeats and cutting off a
    client that reads nothing are done by whoever owns the sources, for all at once. A client
    that disconnects ends the source; ``on_close`` runs however the stream ends.

    The response start goes through the middleware (request id, metrics, CORS headers); the
    body chunks go straight to the server's ``send`` (:data:`RAW_SEND` in the scope), past
    wrappers that only look at the start: under fan-out that is most of the per-event cost.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        source: ChunkSource,
        on_close: Callable[[], Awaitable[None]],
        headers: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        source = self.source
        loop = asyncio.get_running_loop()
        listener = loop.create_task(_until_disconnect(receive, source))
        source.writer = asyncio.current_task()
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + self.extra}
            )
            send = scope.get(RAW_SEND, send)
            while (chunk := await source.next_chunk()) is not None:
                source.sending_since = loop.time()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                source.sending_since = 0.0
                del chunk  # (not held while waiting for the next: a catch-up's can be large)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not source.cut_off:
                raise
            # Cut off: the client read nothing for too long; uvicorn closes the connection.
            if (task := asyncio.current_task()) is not None:  # always: this runs in a task
                task.uncancel()
        except OSError:
            pass  # the connection broke under the send
        finally:
            source.writer = None
            listener.cancel()
            with anyio.CancelScope(shield=True):
                await self.on_close()


async def _until_disconnect(receive: Receive, source: ChunkSource) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    source.end()
