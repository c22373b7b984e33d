"""The delivery engine: one runner per subscription in each gateway process.

A runner pulls from the subscription's durable consumer with an ADR-37 consume
(:class:`app.nats.consume.Consume`: heartbeats, recovery after a reconnect, ADR-42 pin ids),
POSTs each message (or a batch) to the application, and settles it by the answer
(:mod:`app.push.outcome`): ack (confirmed by the server), nak with a delay, or term, after
publishing a dead letter where one is due.

Bounded. Let ``capacity`` = concurrency x batch and ``held`` the messages the runner holds
(taken from the consume and not yet settled: POSTed, or waiting for a free POST). Then
``held <= capacity`` at all times, and what the server may still send adds at most
``capacity - held``:

- the runner takes the next message from the consume only when ``held < capacity``: while
  the application is slow or down, every place is taken and the consume is not read, so it
  sends no pull (a pull is sent from within that read);
- each pull asks for at most ``capacity - held - asked`` messages, ``asked`` being what is
  asked for and not yet taken (the consume's ``room``); a message taken moves from ``asked``
  to ``held``, a pull's end gives back what it did not deliver, and a settled message leaves
  ``held``: none of them raises ``held + asked``.

So a slow or dead application makes the gateway pull less, never buffer more; its memory is
``capacity`` messages per subscription and process. The consume forgets its pulls (ADR-37)
after two missed heartbeats or a reconnect, when the server has most likely dropped them; a
pull the server still honoured then delivers into the NATS client's queue, where it waits
until taken (it is never more than one ``capacity`` and lasts a pull's ``expires`` at most).

Messages are settled by their own ack subject; nothing is acked before the application
answered 2xx. What the runner held when it stops (or its process dies) and did not settle is
delivered again by the server after ``ack_wait``: at least once, never lost. While the
application works on a message, in-progress acks (``+WPI``) sent by one sweeper per runner
keep the server from redelivering it: every message held for a third of ``ack_wait`` since
the server sent it (or since its last one) gets one, so that one goes out before half of
``ack_wait`` has passed. When it was sent is bounded from below by the consume: no earlier
than the oldest pull still owed a message, counting messages in the order they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats.errors
import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from app import __version__, errors
from app.durations import NS_PER_SECOND
from app.metrics import Metrics
from app.nats import acks
from app.nats.consume import (
    Consume,
    ConsumeOptions,
    Delivered,
    Failed,
    Pinned,
    Unpinned,
    Warn,
)
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.nats.pull import PullRequest, unsubscribe
from app.publish.service import Publisher
from app.push import deadletter, mapping, outcome
from app.push.mapping import Delivery
from app.push.outcome import Kind, Verdict
from app.push.schemas import Subscription
from app.push.transport import AnswerTooLarge, Client, Endpoint, TransportError
from app.tasks import cancel_and_wait

log = logging.getLogger("jsgw.push")

PULL_EXPIRES = 30.0
PULL_HEARTBEAT = 5.0
LINGER = 0.05
"""Seconds a partial batch waits for more messages before it is sent as it is."""
MAX_ANSWER = 1024 * 1024
"""Bytes of an answer's body read (a 2xx's for its status); a longer one is retried."""
FIXED_HEADERS = (("User-Agent", f"jsgw/{__version__}"), ("Accept", "application/json, */*"))
CONSUMER_REFRESH = 10.0
_RESTART_FIRST, _RESTART_MAX = 0.5, 10.0
_DEAD_LETTER_RETRY = outcome.DEFAULT_SCHEDULE
_DEFAULT_ACK_WAIT = 30.0
_MAX_REASON = 1024
_LOG_EVERY = 5.0


@dataclass(frozen=True, slots=True)
class ConsumerTerms:
    """What a runner needs of its consumer's config."""

    ack_wait: float = _DEFAULT_ACK_WAIT
    backoff: tuple[float, ...] = ()
    max_deliver: int = 0  # 0: unlimited
    grouped: bool = False
    """The consumer has priority groups: pulls name the subscription's group."""

    @classmethod
    def of(cls, config: dict[str, Any]) -> ConsumerTerms:
        ack_wait = int(config.get("ack_wait") or 0) / NS_PER_SECOND
        backoff = tuple(int(ns) / NS_PER_SECOND for ns in config.get("backoff") or ())
        max_deliver = int(config.get("max_deliver") or 0)
        grouped = bool(config.get("priority_groups"))
        return cls(ack_wait or _DEFAULT_ACK_WAIT, backoff, max(max_deliver, 0), grouped)


@dataclass(frozen=True, slots=True)
class Deps:
    """What runners share in a process."""

    pool: NatsPool
    js: JetStreamApi
    publisher: Publisher
    http: Client
    metrics: Metrics


@dataclass(slots=True)
class Counts:
    delivered: int = 0
    acked: int = 0
    retried: int = 0
    terminated: int = 0
    dead_lettered: int = 0


@dataclass(slots=True, eq=False)
class _Held:
    delivery: Delivery
    touched: float
    """When the server last learnt of it (sent it, at the earliest, or got an in-progress ack
    for it), in the event loop's time."""


@dataclass(slots=True)
class _Instruments:
    delivered: Any
    acked: Any
    retried: Any
    terminated: Any
    dead_lettered: Any
    in_flight: Any
    latency: Callable[[str], Any] = field(repr=False)

    @classmethod
    def of(cls, metrics: Metrics, name: str) -> _Instruments:
        return cls(
            metrics.push_delivered.labels(name),
            metrics.push_acked.labels(name),
            metrics.push_retried.labels(name),
            metrics.push_terminated.labels(name),
            metrics.push_dead_lettered.labels(name),
            metrics.push_in_flight.labels(name),
            lambda label: metrics.push_latency.labels(name, label),
        )


class Runner:
    """Delivers one subscription from this process until stopped."""

    def __init__(
        self,
        name: str,
        config: Subscription,
        deps: Deps,
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``prepare``: makes the consumer when it is missing (a subscription of the file;
        one made through the API had its consumer made by the PUT)."""
        self.name = name
        self._prepare = prepare
        self.config = config
        self.deps = deps
        self.counts = Counts()
        self.last_error: dict[str, str] | None = None
        self.running = False
        self.terms = ConsumerTerms()
        self._loop = asyncio.get_running_loop()
        self._capacity = config.capacity
        self._held: dict[str, _Held] = {}  # by ack subject: one per delivery
        self._ready: deque[_Held] = deque()
        self._posts: set[asyncio.Task[None]] = set()
        self._freed = asyncio.Event()
        self._linger: asyncio.TimerHandle | None = None
        self._stopping = False
        self._quiet_until = 0.0  # no error logged before then
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._metrics = _Instruments.of(deps.metrics, name)
        self._endpoint = Endpoint.parse(config.endpoint)
        self._api_subject = deps.js.subject(
            "CONSUMER", "MSG", "NEXT", config.stream, config.consumer
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = self._loop.create_task(self._run(), name=f"push-{self.name}")

    async def stop(self, grace: float) -> None:
        """Stop pulling at once; let the POSTs under way finish within ``grace`` seconds, then
        abandon them (the server delivers their messages again after ``ack_wait``). Messages
        taken but not yet POSTed are given back now. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        await cancel_and_wait(self._task)
        if self._linger is not None:
            self._linger.cancel()
        waiting = list(self._ready)
        self._ready.clear()
        for held in waiting:
            self._release(held)
        await asyncio.gather(*(self._nak(h.delivery, None, count=False) for h in waiting))
        posts = set(self._posts)
        if posts:  # (in-progress acks go on meanwhile)
            _, late = await asyncio.wait(posts, timeout=grace)
            for task in late:
                await cancel_and_wait(task)
        await cancel_and_wait(self._sweeper)
        self.running = False

    def state(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "running": self.running,
            "in_flight": len(self._held),
            "delivered": counts.delivered,
            "acked": counts.acked,
            "retried": counts.retried,
            "terminated": counts.terminated,
            "dead_lettered": counts.dead_lettered,
            "last_error": self.last_error,
        }

    def _error(self, detail: str) -> None:
        self.last_error = {"time": _now_text(), "detail": detail[:_MAX_REASON]}
        # An application that fails every call would make a line per message: one line every
        # few seconds at most (the state has the last error; the metrics count them all).
        now = self._loop.time()
        if now >= self._quiet_until:
            self._quiet_until = now + _LOG_EVERY
            log.info("subscription %r: %s", self.name, detail)

    # -- pulling ---------------------------------------------------------------------------

    async def _run(self) -> None:
        """Consume until the session fails (consumer gone, refused pulls), then again after
        a backoff, until stopped."""
        delay = _RESTART_FIRST
        while not self._stopping:
            started = self._loop.time()
            try:
                await self._learn_terms()
                if self._sweeper is None:  # paced by the consumer's ack_wait: known now
                    self._sweeper = self._loop.create_task(
                        self._sweep(), name=f"push-wpi-{self.name}"
                    )
                self.running = True
                await self._session()
            except errors.GatewayError as exc:
                self._error(
                    f"pulling from {self.config.stream}/{self.config.consumer}: {exc.detail}"
                )
            except Exception:  # a bug: logged, and the runner starts again
                log.exception("subscription %r: delivery failed", self.name)
            finally:
                self.running = False
            if self._loop.time() - started > 2 * _RESTART_MAX:
                delay = _RESTART_FIRST
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESTART_MAX)

    async def _consumer_info(self) -> dict[str, Any]:
        return await self.deps.js.call(
            "push.consumer_info", "CONSUMER", "INFO", self.config.stream, self.config.consumer
        )

    async def _learn_terms(self) -> None:
        try:
            info = await self._consumer_info()
        except errors.ConsumerNotFound:
            if self._prepare is None:
                raise
            await self._prepare()
            info = await self._consumer_info()
        self.terms = ConsumerTerms.of(info.get("config") or {})

    def _room(self) -> int:
        return self._capacity - len(self._held)

    async def _session(self) -> None:
        config = self.config
        template = PullRequest(
            expires_ns=int(PULL_EXPIRES * NS_PER_SECOND),
            heartbeat_ns=int(PULL_HEARTBEAT * NS_PER_SECOND),
            group=config.group if self.terms.grouped else None,
        )
        options = ConsumeOptions(
            template=template,
            max_messages=self._capacity,
            max_bytes=0,
            threshold_messages=self._capacity // 2,
            threshold_bytes=0,
            bytes_batch=0,
        )
        session = Consume(
            self.deps.pool, self._api_subject, options, check=self._consumer_info, room=self._room
        )
        events = session.events()
        resumed = await self._on_resume(template.group)
        try:
            while True:
                while len(self._held) >= self._capacity:
                    self._freed.clear()
                    await self._freed.wait()
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                if isinstance(event, Delivered):
                    self._take(event.msg, event.sent_after)
                elif isinstance(event, Failed):
                    raise event.error
                elif isinstance(event, Warn):
                    self._error(event.detail)
                elif isinstance(event, Pinned | Unpinned):
                    log.info("subscription %r: %s", self.name, type(event).__name__.lower())
        finally:
            if resumed is not None:
                await unsubscribe(resumed)
            await events.aclose()

    async def _on_resume(self, group: str | None) -> NatsSubscription | None:
        """Wake the consumer when it is resumed: nats-server ends a pause asked for through
        its API without looking at the pulls that wait (a pause that runs out does), so they
        would wait for their next heartbeat. A pull to an inbox nobody listens on wakes it:
        the waiting pulls are served, and that one, without interest, is dropped unserved
        (with max_bytes 1, no message would fit it anyway)."""
        config = self.config
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.PAUSE.{config.stream}.{config.consumer}"
        wake = PullRequest(batch=1, max_bytes=1, expires_ns=NS_PER_SECOND, group=group)
        try:
            client = self.deps.pool.pick()
        except errors.Unavailable:
            return None

        async def advised(msg: Msg) -> None:
            try:
                paused = orjson.loads(msg.data).get("paused")
            except (orjson.JSONDecodeError, AttributeError):
                return
            if paused is False:
                with contextlib.suppress(nats.errors.Error):
                    await client.publish(
                        self._api_subject, wake.payload(), reply=client.new_inbox()
                    )

        try:
            return await client.subscribe(subject, cb=advised)
        except nats.errors.Error:
            return None

    def _take(self, msg: Msg, sent_after: float) -> None:
        meta = acks.parse_ack_subject(msg.reply or "")
        if meta is None or meta.stream != self.config.stream:
            self._error(
                f"the server delivered a message without a valid ack subject: {msg.reply!r}"
            )
            return
        # Its ack_wait runs from when the server sent it, which may be a while before it is
        # taken (it waits in the NATS client while this process is busy): counted from the
        # earliest it can have been sent.
        held = _Held(Delivery(msg, meta), sent_after)
        self._held[msg.reply] = held
        self._metrics.in_flight.inc()
        self._ready.append(held)
        self._dispatch()

    def _release(self, held: _Held) -> None:
        if self._held.pop(held.delivery.msg.reply, None) is not None:
            self._metrics.in_flight.dec()
        self._freed.set()

    # -- POSTing ---------------------------------------------------------------------------

    def _dispatch(self, flush: bool = False) -> None:
        """Start POSTs while there are messages ready and POSTs free; a partial batch waits
        up to :data:`LINGER` for more."""
        batch = self.config.batch
        while self._ready and len(self._posts) < self.config.concurrency and not self._stopping:
            if len(self._ready) < batch and not flush:
                if self._linger is None:
                    self._linger = self._loop.call_later(LINGER, self._lingered)
                return
            items = [self._ready.popleft() for _ in range(min(batch, len(self._ready)))]
            task = self._loop.create_task(self._post(items))
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)

    def _lingered(self) -> None:
        self._linger = None
        self._dispatch(flush=True)

    async def _post(self, items: list[_Held]) -> None:
        try:
            deliveries = [held.delivery for held in items]
            self.counts.delivered += len(items)
            self._metrics.delivered.inc(len(items))
            started = time.perf_counter()
            try:
                label, verdicts = await self._call(deliveries)
            except Exception:  # a bug: logged, and the messages given back for later
                log.exception("subscription %r: delivery failed", self.name)
                verdict = outcome.failure("the gateway failed to deliver it (see its log)", "retry")
                label, verdicts = verdict.label, [verdict] * len(items)
            self._metrics.latency(label).observe(time.perf_counter() - started)
            await asyncio.gather(
                *(
                    self._settle(held, verdict)
                    for held, verdict in zip(items, verdicts, strict=True)
                )
            )
        finally:
            for held in items:
                self._release(held)
            self._dispatch()

    async def _call(self, deliveries: list[Delivery]) -> tuple[str, list[Verdict]]:
        """POST the messages; the answer's class (for the latency metric) and a verdict each."""
        config = self.config
        if config.batch > 1:
            request = mapping.batch(deliveries, config.consumer)
        else:
            request = mapping.single(deliveries[0], config.consumer, config.format == "cloudevents")
        timeout = config.timeout_seconds
        count = len(deliveries)
        try:
            async with asyncio.timeout(timeout):
                answer = await self.deps.http.post(self._endpoint, request.headers, request.body)
        except TimeoutError:
            verdict = outcome.failure(f"no answer within {timeout:g} s", "timeout")
            return verdict.label, [verdict] * count
        except AnswerTooLarge as exc:
            verdict = outcome.failure(str(exc), "retry")
            return verdict.label, [verdict] * count
        except TransportError as exc:
            detail = str(exc) or type(exc).__name__
            verdict = outcome.failure(f"cannot reach the endpoint: {detail}", "unreachable")
            return verdict.label, [verdict] * count
        status, body, headers = answer.status, answer.body, answer.headers
        now = datetime.now(UTC)
        if config.batch > 1:
            verdicts = outcome.classify_batch(
                status, headers, body, [d.key for d in deliveries], now
            )
            label = "success" if 200 <= status < 300 else verdicts[0].label
            return label, verdicts
        verdict = outcome.classify(status, headers, body, now)
        return verdict.label, [verdict]

    # -- settling --------------------------------------------------------------------------

    async def _settle(self, held: _Held, verdict: Verdict) -> None:
        delivery = held.delivery
        if verdict.noteworthy:
            self._error(f"{_name(delivery)}: {verdict.reason}")
        if verdict.kind is Kind.ACK:
            await self._ack(delivery)
        elif verdict.kind is Kind.RETRY:
            if not self._last_delivery(delivery):
                delay = outcome.retry_delay(
                    delivery.meta.delivered, self.terms.backoff, verdict.retry_after
                )
                await self._nak(delivery, delay)
                return
            reason = f"max_deliver ({self.terms.max_deliver}) reached: {verdict.reason}"
            if self.config.dead_letter is None:
                # The server delivers it no more: a nak ends it at once (with its
                # MAX_DELIVERIES advisory) rather than after ack_wait.
                if await self._nak(delivery, None, count=False):
                    self._terminated()
                return
            await self._dead_letter_last(held, reason)
        elif self.config.dead_letter is not None:
            await self._dead_letter(delivery, verdict.reason)
        else:
            await self._term(delivery, verdict.reason)

    def _last_delivery(self, delivery: Delivery) -> bool:
        limit = self.terms.max_deliver
        return limit > 0 and delivery.meta.delivered >= limit

    async def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Dead-letter, then term. If the dead letter is not published, the message is kept:
        nak'ed to come back later."""
        if await self._publish_dead_letter(delivery, reason):
            await self._term(delivery, reason)
            return
        delay = outcome.retry_delay(delivery.meta.delivered, self.terms.backoff, None)
        await self._nak(delivery, delay)

    async def _dead_letter_last(self, held: _Held, reason: str) -> None:
        """At max_deliver a nak would end the message: it is held (in-progress acks keep it)
        and its dead letter tried again until published, or until the runner stops."""
        attempt = 0
        while not await self._publish_dead_letter(held.delivery, reason):
            await asyncio.sleep(_DEAD_LETTER_RETRY[min(attempt, len(_DEAD_LETTER_RETRY) - 1)])
            attempt += 1
        await self._term(held.delivery, reason)

    async def _publish_dead_letter(self, delivery: Delivery, reason: str) -> bool:
        assert self.config.dead_letter is not None
        subject = self.config.dead_letter.subject
        try:
            await deadletter.publish(self.deps.publisher, subject, delivery, reason)
        except errors.GatewayError as exc:
            self._error(
                f"{_name(delivery)}: dead letter to {subject!r} not published: {exc.detail}"
            )
            return False
        self.counts.dead_lettered += 1
        self._metrics.dead_lettered.inc()
        return True

    async def _reply(self, delivery: Delivery, payload: bytes, what: str) -> bool:
        """Send an ack of some kind and wait for the server's confirmation."""
        try:
            await self.deps.pool.request(delivery.msg.reply, payload, operation=f"push.{what}")
        except errors.GatewayError as exc:
            self._error(f"{_name(delivery)}: {what} not confirmed: {exc.detail}")
            return False
        return True

    async def _ack(self, delivery: Delivery) -> None:
        if await self._reply(delivery, b"+ACK", "ack"):
            self.counts.acked += 1
            self._metrics.acked.inc()

    async def _nak(self, delivery: Delivery, delay: float | None, *, count: bool = True) -> bool:
        payload = b"-NAK"
        if delay:
            payload += b" " + orjson.dumps({"delay": int(delay * NS_PER_SECOND)})
        done = await self._reply(delivery, payload, "nak")
        if done and count:
            self.counts.retried += 1
            self._metrics.retried.inc()
        return done

    async def _term(self, delivery: Delivery, reason: str) -> None:
        if await self._reply(delivery, b"+TERM " + _reason(reason), "term"):
            self._terminated()

    def _terminated(self) -> None:
        self.counts.terminated += 1
        self._metrics.terminated.inc()

    # -- in-progress acks ------------------------------------------------------------------

    async def _sweep(self) -> None:
        """Every sixth of ack_wait (at most every second), an in-progress ack for each
        message held for a third of it since it was sent (or last reported): it goes out
        before half of ack_wait has passed. The consumer's terms are read again every so
        often."""
        refreshed = self._loop.time()
        while True:
            await asyncio.sleep(min(max(self.terms.ack_wait / 6, 0.05), 1.0))
            now = self._loop.time()
            due = [h for h in self._held.values() if now - h.touched >= self.terms.ack_wait / 3]
            if due:
                await self._progress(due, now)
            if now - refreshed >= CONSUMER_REFRESH:
                refreshed = now
                with contextlib.suppress(errors.GatewayError):
                    await self._learn_terms()

    async def _progress(self, due: list[_Held], now: float) -> None:
        try:
            client = self.deps.pool.pick()
        except errors.Unavailable:
            return
        for held in due:
            try:
                await client.publish(held.delivery.msg.reply, b"+WPI")
            except nats.errors.Error:
                return
            held.touched = now


def _name(delivery: Delivery) -> str:
    return f"{delivery.meta.stream}:{delivery.meta.stream_seq}"


def _reason(text: str) -> bytes:
    """A term reason the server takes: one line, printable."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text)
    return cleaned[:_MAX_REASON].encode()


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
