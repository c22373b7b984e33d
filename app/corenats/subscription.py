"""One HTTP client's core NATS subscription: a NATS subscription of its own and a bounded
queue between it and the client's event stream.

Core NATS keeps nothing: a message the client cannot take now is lost to it, and the only
choice left is where the backlog lives. It lives here, bounded twice (``max_messages`` and
``max_bytes``, subjects, headers and payloads counted), and a client that lets either fill is
a slow consumer: its queue is dropped at once, its NATS subscription is ended (the server
stops sending), and the next thing the stream sends is an ``error`` event
``nats.slow_consumer``, then the end. Nothing else holds the client's messages: the event
stream's writer waits on the HTTP connection's own flow control (uvicorn holds at most its
write buffer's high-water mark per connection), so the gateway's memory for one subscriber
is at most the two bounds plus one event, however much is published and however little the
client reads.

Messages arrive on the connection's reading task (:meth:`on_message`, a plain callback of
:meth:`app.nats.replies.LeanClient.raw_subscribe`), and leave on the response's task
(:meth:`events`); both run on the one event loop, so the queue needs no lock.
"""

from __future__ import annotations

import asyncio
import binascii
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from app import errors
from app.durations import format_time
from app.errors import ErrorCode
from app.nats.headers import parse

Visible = Callable[[str], bool]
_CHECK_INTERVAL = 1.0  # seconds: how often an idle stream checks that its connection lives


class Subscription:
    """The queue of one subscriber; :meth:`events` is its SSE stream (each event a dict as
    sse-starlette takes it)."""

    def __init__(
        self,
        *,
        max_messages: int,
        max_bytes: int,
        visible: Visible | None = None,
        on_sent: Callable[[], None] | None = None,
        on_slow: Callable[[], None] | None = None,
    ) -> None:
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._visible = visible
        self._on_sent = on_sent
        self._on_slow = on_slow
        self._queue: deque[tuple[bytes, bytes | None, bytes, datetime]] = deque()
        self._bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._end: errors.GatewayError | None = None
        self._stopped = False
        self.on_end: Callable[[], None] | None = None  # stops the NATS subscription
        self.alive: Callable[[], bool] | None = None  # whether its NATS connection lives
        self.filtered = 0  # messages the token may not read, not sent (narrowing)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def ended(self) -> bool:
        return self._end is not None or self._stopped

    def on_message(self, subject: bytes, headers: bytes | None, data: bytes) -> None:
        if self._end is not None or self._stopped:
            return
        try:
            text = subject.decode()
        except UnicodeDecodeError:
            # nats-server passes subjects of any bytes; no rule can grant one that is not
            # text, and raising here would break the connection's reading loop.
            self.filtered += 1
            return
        visible = self._visible
        if visible is not None and not visible(text):
            self.filtered += 1
            return
        size = len(subject) + len(headers or b"") + len(data)
        if len(self._queue) >= self._max_messages or self._bytes + size > self._max_bytes:
            self._slow()
            return
        self._queue.append((subject, headers, data, datetime.now(UTC)))
        self._bytes += size
        self._wake()

    def _slow(self) -> None:
        self._queue.clear()
        self._bytes = 0
        if self._on_slow is not None:
            self._on_slow()
        self.end(
            errors.TooManyRequests(
                ErrorCode.NATS_SLOW_CONSUMER,
                f"the client fell behind by more than {self._max_messages} messages or "
                f"{self._max_bytes} bytes: the subscription ends (core NATS keeps no messages; "
                "what was published since is lost to it); reconnect",
            )
        )

    def end(self, error: errors.GatewayError) -> None:
        """End the stream with an ``error`` event after what is queued (dropped by a slow
        consumer's end), and stop the NATS subscription."""
        if self._end is not None or self._stopped:
            return
        self._end = error
        self._wake()
        if self.on_end is not None:
            self.on_end()

    def stop(self) -> None:
        """The client left: drop everything."""
        self._stopped = True
        self._queue.clear()
        self._bytes = 0
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            queue = self._queue
            while queue:
                subject, headers, data, received = queue.popleft()
                self._bytes -= len(subject) + len(headers or b"") + len(data)
                event = {
                    "event": "message",
                    "data": _message_json(subject, headers, data, received),
                }
                del data, headers  # (not held while the client takes the event)
                yield event
                if self._on_sent is not None:
                    self._on_sent()
            if self._end is not None:
                yield {"event": "error", "data": orjson.dumps(self._end.problem()).decode()}
                return
            waiter = self._waiter = loop.create_future()
            try:
                await asyncio.wait_for(waiter, _CHECK_INTERVAL)
            except TimeoutError:
                if self.alive is not None and not self.alive():
                    self.end(
                        errors.Unavailable(
                            ErrorCode.NATS_UNAVAILABLE,
                            "the gateway's NATS connection for this subscription is gone; "
                            "reconnect",
                        )
                    )
            finally:
                self._waiter = None


def _message_json(subject: bytes, headers: bytes | None, data: bytes, received: datetime) -> str:
    """Message JSON without ``stream`` and ``seq`` (core NATS stores nothing); ``time`` is
    when the gateway received it."""
    return orjson.dumps(
        {
            "subject": subject.decode(),
            "time": format_time(received),
            "headers": parse(headers).values,
            "data": binascii.b2a_base64(data, newline=False).decode(),
        }
    ).decode()
