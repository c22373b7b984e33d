"""Core NATS publish, request/reply and subscribe on the gateway's pooled connections.

No JetStream here: a publish is handed to a connection and not confirmed by anyone (a stream
that captures the subject stores it, but no PubAck tells the client); a request waits for the
first reply of whoever answers; a subscription gets what is published while it lasts.
Subjects are checked by the caller (:mod:`app.corenats.subjects`), and so is access.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from app import errors
from app.config import Settings
from app.corenats.subscription import Subscription, Visible
from app.errors import ErrorCode
from app.metrics import Metrics
from app.nats.pool import NatsPool
from app.nats.replies import RawSubscription, Reply
from app.publish.service import Outgoing, fitting

MIN_TIMEOUT = 0.001  # seconds: a request's shortest timeout
DEFAULT_MAX_TIMEOUT: float = Settings.model_fields["nats_request_max_timeout"].default


class CoreNats:
    def __init__(self, pool: NatsPool, settings: Settings, metrics: Metrics) -> None:
        self._pool = pool
        self._settings = settings
        self._metrics = metrics
        self._subscriptions: set[Subscribed] = set()

    @property
    def max_payload(self) -> int:
        return self._pool.max_payload

    def timeout(self, asked_ns: int | None) -> float:
        """The request's timeout in seconds: ``JSGW_REQUEST_TIMEOUT`` when not asked, and at
        most ``JSGW_NATS_REQUEST_MAX_TIMEOUT`` (400 above it)."""
        if asked_ns is None:
            return min(self._settings.request_timeout, self._settings.nats_request_max_timeout)
        most = self._settings.nats_request_max_timeout
        if not MIN_TIMEOUT * 1e9 <= asked_ns <= most * 1e9:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID,
                f"timeout must be at least {MIN_TIMEOUT * 1000:g} ms and at most {most:g} s "
                "(JSGW_NATS_REQUEST_MAX_TIMEOUT)",
            )
        return asked_ns / 1e9

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Hand the message to a connection that is up (503 when none is); nothing confirms
        that anyone got it."""
        fitting(Outgoing(subject, data, headers), self._pool.max_payload)
        client = self._pool.pick()
        await self._pool.observe(
            "core_publish", lambda: client.publish(subject, data, headers=headers or None)
        )

    async def request(
        self, subject: str, data: bytes, headers: dict[str, str], timeout: float
    ) -> Reply:
        """The first reply. 503 ``nats.no_responders`` when the server says nobody listens
        (a reply with status 503 and no payload), 504 ``nats.timeout`` when nobody answered in
        time. Sent once: a connection lost while waiting is a 504, not a second request to a
        responder that may have acted on the first."""
        fitting(Outgoing(subject, data, headers), self._pool.max_payload)
        return await self._pool.request(
            subject,
            data,
            operation="core_request",
            headers=headers or None,
            timeout=timeout,
            client=self._pool.pick(),
        )

    async def subscribe(
        self, subject: str, queue: str | None, visible: Visible | None
    ) -> Subscribed:
        """Subscribe now, and flush, so that what is published once the answer has started
        reaches the stream; :meth:`Subscribed.close` ends it."""
        metrics = self._metrics
        subscription = Subscription(
            max_messages=self._settings.sse_queue_size,
            max_bytes=self._settings.nats_subscribe_queue_bytes,
            visible=visible,
            on_sent=metrics.core_messages_sent.inc,
            on_slow=metrics.core_slow_consumers.inc,
        )
        raw = await self._pool.raw_subscription(
            subject, subscription.on_message, queue=queue or "", operation="core_subscribe"
        )
        opened = Subscribed(subscription, raw, self._subscriptions)
        self._subscriptions.add(opened)
        return opened

    def close(self) -> None:
        """End every subscription (its client gets an ``error`` event)."""
        for opened in list(self._subscriptions):
            opened.subscription.end(
                errors.Unavailable(
                    ErrorCode.GATEWAY_SHUTDOWN, "the gateway is shutting down; reconnect"
                )
            )


class Subscribed:
    """A subscription with its NATS side: :meth:`events` for the response, :meth:`close`
    (idempotent) when the response ends, however it ends (also when it never started)."""

    def __init__(
        self, subscription: Subscription, raw: RawSubscription, registry: set[Subscribed]
    ) -> None:
        self.subscription = subscription
        self._raw = raw
        self._registry = registry
        subscription.on_end = self._unsubscribe_soon
        subscription.alive = lambda: raw.alive

    def events(self) -> AsyncIterator[dict[str, Any]]:
        return self.subscription.events()

    def _unsubscribe_soon(self) -> None:
        self._raw.close_soon()

    async def close(self) -> None:
        self.subscription.stop()
        self._registry.discard(self)
        await self._raw.close()
