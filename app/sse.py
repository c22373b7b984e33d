"""What every SSE endpoint shares: caps on open streams, heartbeats, and a farewell event
when the gateway shuts down (so clients know to reconnect elsewhere instead of guessing)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from app import errors

SHUTDOWN_GRACE = 2.0


class SseSlots:
    """Counts open SSE streams per token and per gateway instance."""

    def __init__(self, per_token: int, per_instance: int, retry_after: int) -> None:
        self.per_token = per_token
        self.per_instance = per_instance
        self.retry_after = retry_after
        self.by_token: Counter[str] = Counter()
        self.total = 0

    def acquire(self, owner: str) -> Callable[[], Awaitable[None]]:
        """Take a slot (429 when none is free); returns its idempotent release."""
        if self.total >= self.per_instance:
            raise self._full("this gateway has too many open streams")
        if self.by_token[owner] >= self.per_token:
            raise self._full("this token has too many open streams")
        self.by_token[owner] += 1
        self.total += 1
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.total -= 1
                self.by_token[owner] -= 1
                if self.by_token[owner] <= 0:
                    del self.by_token[owner]

        return release

    def _full(self, detail: str) -> errors.TooManyRequests:
        return errors.TooManyRequests(
            "sse.too_many_streams",
            f"{detail}; close one or retry later",
            headers={"Retry-After": str(self.retry_after)},
        )


def farewell() -> ServerSentEvent:
    return ServerSentEvent(
        event="error",
        data='{"code":"gateway.shutdown","detail":"the gateway is shutting down; reconnect"}',
    )


async def _until_shutdown(
    events: AsyncIterator[Any], shutdown: anyio.Event
) -> AsyncIterator[Any]:
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
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
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
