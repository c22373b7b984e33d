"""ADR-37 ``consume``: continuous pulls on one subscription, with ADR-42 pin tracking.

The algorithm of ADR-37: keep the counts of messages and bytes asked for but not yet received;
pull again whenever they fall to the threshold; subtract what the server reports as left over
(``Nats-Pending-Messages`` / ``Nats-Pending-Bytes``) when a pull ends; expect a heartbeat or a
message at least every idle heartbeat and warn after two missed; after a reconnect check that the
consumer still exists, then pull again. Each pull replies to ``<inbox>.<n>`` under one wildcard
subscription, so a status can be traced to the request it ends (and to the pin id it carried).

Nothing here acks: messages the client never received are redelivered after ``ack_wait``.

A caller that holds on to what it takes (push delivery, app.push.runner) passes ``room``: how
many more messages it can take now. A pull then asks for no more than that room less what is
already asked for and not yet taken, so that what the caller holds plus what may still come
stays within what it said it can take.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace

import anyio
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app import errors
from app.errors import ErrorCode, WarningCode
from app.nats.pool import NatsPool
from app.nats.pull import (
    CLIENT_MARGIN,
    PIN_HEADER,
    PullRequest,
    Status,
    message_size,
    status_of,
    unsubscribe,
)

log = logging.getLogger("jsgw.consume")

# How often connection state is looked at while no message arrives.
_POLL = 0.25
_MAX_BACKOFF = 5.0


@dataclass(frozen=True, slots=True)
class ConsumeOptions:
    template: PullRequest
    """expires, heartbeat and the ADR-42 fields of all pulls (batch, max_bytes, id: per pull)."""
    max_messages: int
    """Buffer size in messages (0 when buffering by bytes)."""
    max_bytes: int
    """Buffer size in bytes (0 when buffering by messages)."""
    threshold_messages: int
    threshold_bytes: int
    bytes_batch: int
    """The batch of a pull when buffering by bytes: large, but within the consumer's max_batch."""
    pin_id: str | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    msg: Msg
    sent_after: float = 0.0
    """The server sent it no earlier than this (the event loop's time): when the oldest pull
    that, counting the messages in the order they came, still awaited one was sent. 0 when
    unknown (it came for a pull forgotten since)."""


@dataclass(frozen=True, slots=True)
class Pinned:
    pin_id: str


@dataclass(frozen=True, slots=True)
class Unpinned:
    pin_id: str


@dataclass(frozen=True, slots=True)
class Warn:
    code: ErrorCode | WarningCode
    detail: str


@dataclass(frozen=True, slots=True)
class Failed:
    error: errors.GatewayError


Event = Delivered | Pinned | Unpinned | Warn | Failed


@dataclass(slots=True)
class _Pull:
    messages: int
    """What this pull still counts for in the pending totals."""
    bytes: int
    sent_bytes: int
    pin_id: str | None
    give_up_at: float
    sent_at: float = 0.0
    unfilled: int = 0
    """Messages still to come for it, counting each message as the oldest pull's (the server
    serves waiting pulls in turn, so this is no exact count of its own)."""


class Consume:
    """One consume session. ``check`` raises NotFound when the consumer is gone."""

    def __init__(
        self,
        pool: NatsPool,
        subject: str,
        options: ConsumeOptions,
        check: Callable[[], Awaitable[object]],
        room: Callable[[], int] | None = None,
    ) -> None:
        self._pool = pool
        self._room = room
        self._subject = subject
        self._options = options
        self._check = check
        self._heartbeat = options.template.heartbeat
        self._loop = asyncio.get_running_loop()
        self._client: Client | None = None
        self._sub: Subscription | None = None
        self._inbox = ""
        self._connected = True
        self._reconnects = 0
        self._recovering: str | None = None
        self._pulls: dict[str, _Pull] = {}
        self._unfilled: deque[_Pull] = deque()  # the pulls counted as awaiting messages
        self._counter = 0
        self.pending_messages = 0
        self.pending_bytes = 0
        self.pin_id = options.pin_id
        self._quiet_until = 0.0

    async def events(self) -> AsyncGenerator[Event, None]:
        """Delivered messages and notices, until a terminal error (the last event) or the end."""
        backoff = _POLL
        warned = False
        try:
            while True:
                client = self._client
                if client is None or client.is_closed:
                    if await self._attach():
                        continue
                    if not warned:
                        warned = True
                        yield Warn(
                            ErrorCode.NATS_UNAVAILABLE,
                            "no NATS connection; pulling resumes when one is up",
                        )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                if not client.is_connected:
                    if self._connected:
                        self._connected = False
                        yield Warn(
                            WarningCode.NATS_DISCONNECTED,
                            "the gateway lost its NATS connection; pulling resumes when it is back",
                        )
                    await asyncio.sleep(_POLL)
                    continue
                if not self._connected or client.stats["reconnects"] != self._reconnects:
                    self._connected = True
                    self._reconnects = client.stats["reconnects"]
                    self._recovering = "reconnected"
                if self._recovering:
                    # ADR-37: after a reconnect the server may have lost our pulls (a restart);
                    # make sure the consumer is still there before pulling again.
                    try:
                        await self._check()
                    except errors.NotFound as exc:
                        yield Failed(exc)
                        return
                    except errors.GatewayError as exc:
                        if not warned:
                            warned = True
                            yield Warn(
                                WarningCode.CONSUMER_RECOVERING,
                                f"checking the consumer: {exc.detail}",
                            )
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, _MAX_BACKOFF)
                        continue
                    if self._recovering == "no responders":
                        await asyncio.sleep(_POLL)  # the consumer is there: JetStream was not
                    self._recovering = None
                    self._forget(drop=True)
                    self._quiet_until = self._loop.time() + 2 * self._heartbeat
                backoff, warned = _POLL, False
                for event in await self._step(client):
                    yield event
                    if isinstance(event, Failed):
                        return
        finally:
            await self._detach()

    async def _step(self, client: Client) -> list[Event]:
        """Pull if the buffer is low, then take the next message (or notice the silence)."""
        assert self._sub is not None
        now = self._loop.time()
        self._expire(now)
        if self._low():
            try:
                await self._pull(client, now)
            except nats.errors.Error as exc:
                log.debug("pull request not sent: %r", exc)
                await asyncio.sleep(_POLL)
                return []
        try:
            msg = await self._sub.next_msg(timeout=max(0.001, min(_POLL, self._quiet_until - now)))
        except nats.errors.ConnectionClosedError:
            return []  # the pool gave this connection up: the loop attaches to another one
        except nats.errors.TimeoutError:
            if self._loop.time() < self._quiet_until or not client.is_connected:
                return []
            # Two heartbeats missed (ADR-37): warn, forget what was asked for and pull afresh.
            self._forget(drop=False)
            self._quiet_until = self._loop.time() + 2 * self._heartbeat
            silence = f"{2 * self._heartbeat:g}s"
            detail = f"no message or heartbeat from the server for {silence}; pulling again"
            return [Warn(WarningCode.CONSUMER_HEARTBEAT_MISSED, detail)]
        self._quiet_until = self._loop.time() + 2 * self._heartbeat
        status = status_of(msg)
        if status is None:
            return self._delivered(msg)
        return self._ended(msg.subject.rsplit(".", 1)[-1], status)

    def _delivered(self, msg: Msg) -> list[Event]:
        self.pending_messages = max(0, self.pending_messages - 1)
        self.pending_bytes = max(0, self.pending_bytes - message_size(msg))
        events: list[Event] = []
        pin = msg.headers.get(PIN_HEADER) if msg.headers else None
        if pin and pin != self.pin_id:
            self.pin_id = pin
            events.append(Pinned(pin))
        events.append(Delivered(msg, self._sent_after()))
        return events

    def _sent_after(self) -> float:
        """When the pull was sent that this message is counted for (see Delivered.sent_after).

        Messages come in the order the server sent them, and none for a pull before the pull
        was sent: if the older pulls have had as many messages as they asked for, this one
        was sent after the oldest pull that has not (whichever pull it was really for)."""
        unfilled = self._unfilled
        while unfilled and unfilled[0].unfilled <= 0:
            unfilled.popleft()
        if not unfilled:
            return 0.0
        head = unfilled[0]
        head.unfilled -= 1
        return head.sent_at

    def _ended(self, key: str, status: Status) -> list[Event]:
        if status.heartbeat:
            return []
        pull = self._pulls.pop(key, None)
        if pull is not None:
            pull.unfilled = 0
            # What the pull did not deliver no longer counts as pending. Statuses sent before a
            # pull was queued carry no counts: then it delivered nothing.
            left = status.pending_messages if status.pending_messages is not None else pull.messages
            left_bytes = status.pending_bytes if status.pending_bytes is not None else pull.bytes
            self.pending_messages = max(0, self.pending_messages - min(left, pull.messages))
            self.pending_bytes = max(0, self.pending_bytes - min(left_bytes, pull.bytes))
        if status.no_responders:
            self._recovering = "no responders"  # the consumer or JetStream is gone: which?
            return []
        if status.pin_lost:
            if pull is not None and pull.pin_id is not None and pull.pin_id == self.pin_id:
                self.pin_id = None
                return [Unpinned(pull.pin_id)]
            return []  # a pull that still carried an id we had already dropped
        if status.message_too_large and pull is not None:
            if (
                pull.sent_bytes == self._options.max_bytes
                and status.pending_bytes == pull.sent_bytes
            ):
                too_large = errors.Conflict(
                    ErrorCode.CONSUMER_MESSAGE_TOO_LARGE,
                    f"the next message is larger than max_bytes ({self._options.max_bytes}); "
                    "consume with a larger max_bytes, or by max_messages",
                )
                return [Failed(too_large)]
            return []
        if status.terminal:
            return [Failed(status.error())]
        if status.ends_quietly:
            return []
        return [Warn(status.error().code, f"{status.code} {status.description}")]

    def _low(self) -> bool:
        options = self._options
        if options.max_bytes:
            return self.pending_bytes <= options.threshold_bytes
        return self.pending_messages <= options.threshold_messages

    async def _pull(self, client: Client, now: float) -> None:
        options = self._options
        if options.max_bytes:
            batch, max_bytes = options.bytes_batch, options.max_bytes - self.pending_bytes
        else:
            batch, max_bytes = options.max_messages - self.pending_messages, 0
            if self._room is not None:
                batch = min(batch, self._room() - self.pending_messages)
        if batch <= 0:
            return
        self._counter += 1
        key = str(self._counter)
        request = replace(options.template, batch=batch, max_bytes=max_bytes, pin_id=self.pin_id)
        await client.publish(self._subject, request.payload(), reply=f"{self._inbox}.{key}")
        if not self._pulls:
            # Nothing was waiting, so nothing could send heartbeats (say while the HTTP client
            # was slow to take the last messages): the silence starts now.
            self._quiet_until = now + 2 * self._heartbeat
        give_up_at = now + request.expires + CLIENT_MARGIN
        pull = _Pull(batch, max_bytes, max_bytes, self.pin_id, give_up_at, now, batch)
        self._pulls[key] = pull
        if not options.max_bytes:
            self._unfilled.append(pull)
        self.pending_messages += batch
        self.pending_bytes += max_bytes

    def _expire(self, now: float) -> None:
        """Forget pulls past their end (oldest first: all have the same ``expires``).

        A pull whose batch was delivered whole ends without a word from the server (only one
        that ends early says what it left: a 408 or 409 with ``Nats-Pending-Messages``), and
        each of its messages was counted off as it came: by messages, a pull past its end
        leaves nothing more to count off (taking its batch off again would count its
        messages twice, and pull more than the buffer holds). By bytes, what it asked for is
        taken off, as the sizes counted off are the client's estimate. When nothing is
        pending by messages, no pull can deliver more, so none is kept.
        """
        pulls = self._pulls
        if not self._options.max_bytes and self.pending_messages == 0:
            pulls.clear()
            self._unfilled.clear()
            return
        while pulls:
            key, pull = next(iter(pulls.items()))
            if pull.give_up_at > now:
                return
            del pulls[key]
            pull.unfilled = 0
            self.pending_bytes = max(0, self.pending_bytes - pull.bytes)

    def _forget(self, *, drop: bool) -> None:
        """Start counting afresh. ``drop``: the server lost the pulls too (reconnect); otherwise
        their statuses may still come, and are then only looked at for the pin id."""
        self.pending_messages = self.pending_bytes = 0
        self._unfilled.clear()
        if drop:
            self._pulls.clear()
        for pull in self._pulls.values():
            pull.messages = pull.bytes = 0

    async def _attach(self) -> bool:
        """Subscribe on a pooled connection (again, after the pool replaced ours)."""
        await self._detach()
        try:
            client = self._pool.pick()
        except errors.Unavailable:
            return False
        inbox = client.new_inbox()
        try:
            self._sub = await client.subscribe(f"{inbox}.*")
        except nats.errors.Error:
            return False
        replaced = self._client is not None
        self._client, self._inbox = client, inbox
        self._connected = client.is_connected
        self._reconnects = client.stats["reconnects"]
        self._forget(drop=True)
        self._recovering = "replaced" if replaced else None
        self._quiet_until = self._loop.time() + 2 * self._heartbeat
        return True

    async def _detach(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            # Shielded: this runs when the HTTP client went away and the stream is being
            # cancelled, and the UNSUB must still go out so the server stops delivering at once.
            with anyio.CancelScope(shield=True):
                await unsubscribe(sub)
