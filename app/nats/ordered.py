"""An ordered push consumer (ADR-17) that outlives server restarts and knows when its stream
is gone.

nats-py has an ordered consumer, but when re-creating it fails it only calls the connection's
error callback and stops, and it cannot say that the stream itself was deleted. A KV watch
needs both, so the gateway runs the protocol itself:

- an ephemeral push consumer (flow control, idle heartbeats, ack none, memory storage) on a
  fresh inbox per consumer "generation";
- every delivery must carry the next consumer sequence, every heartbeat the last one sent;
  otherwise, or after two heartbeat intervals of silence, or when the server announces that
  the consumer was deleted, the consumer is re-created from the stream sequence after the
  last one delivered;
- before re-creating, a stream info tells a deleted (or deleted and re-created) stream from a
  lost consumer; while NATS is unreachable it keeps retrying with a backoff.

Deliveries are handed to a listener that must not block (it owns any queueing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app import errors
from app.durations import NS_PER_SECOND
from app.nats.jsapi import JetStreamApi
from app.nats.pull import unsubscribe
from app.nats.scan import Delivery, delivery
from app.tasks import cancel_and_wait

log = logging.getLogger("jsgw.ordered")

_INACTIVE_THRESHOLD_NS = 30 * NS_PER_SECOND
_MAX_BACKOFF = 5.0
_MISSED_HEARTBEATS = 2
_LAST_CONSUMER = "Nats-Last-Consumer"
_STALLED = "Nats-Consumer-Stalled"


@dataclass(frozen=True, slots=True)
class OrderedConfig:
    stream: str
    filter_subject: str
    deliver_policy: str  # all | last_per_subject | new | by_start_sequence
    start_seq: int | None = None
    headers_only: bool = False
    idle_heartbeat: float = 5.0


class Listener(Protocol):
    def on_start(self, num_pending: int, position: int) -> None:
        """A consumer was (re)created with this much pending; everything up to ``position``
        in the filter has been seen when nothing is pending."""

    def on_message(self, message: Delivery) -> None:
        """The next message, in stream order, never twice."""

    def on_error(self, error: errors.GatewayError) -> None:
        """The feed ended for good (stream deleted, consumer refused)."""


class _Closed:
    """The listener of a closed consumer: hears nothing."""

    def on_start(self, num_pending: int, position: int) -> None:
        pass

    def on_message(self, message: Delivery) -> None:
        pass

    def on_error(self, error: errors.GatewayError) -> None:
        pass


_CLOSED = _Closed()


def _stream_gone(stream: str) -> errors.GatewayError:
    return errors.StreamDeleted(detail=f"stream {stream!r} was deleted")


class OrderedConsumer:
    def __init__(self, js: JetStreamApi, config: OrderedConfig, listener: Listener) -> None:
        self.js = js
        self.config = config
        self.listener = listener
        self._loop = asyncio.get_running_loop()
        self._generation = 0
        self._sub: Subscription | None = None
        self._advisory: Subscription | None = None
        self._consumer: str | None = None
        self._expected = 1  # the consumer sequence the next delivery must carry
        # Every message of the filter up to this stream sequence was delivered (or superseded);
        # None until known (last_per_subject delivers in an order of its own).
        self._position: int | None = None
        self._stream_created: str | None = None
        # A stream sequence the server of the current consumer is known to hold (see _attach):
        # a consumer that has nothing pending after a message has delivered everything in
        # its filter up to here.
        self.holds = 0
        self._last_seen = self._loop.time()
        self._reset = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False

    def silent_for(self) -> float:
        """Seconds since the server last sent a message or a heartbeat."""
        return self._loop.time() - self._last_seen

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, info: dict[str, Any] | None = None) -> None:
        """Create the first consumer; errors (stream not found, ...) are raised here.
        ``info``: the stream's info, when the caller has just asked for it."""
        if info is None:
            info = await self.js.call("stream.info", "STREAM", "INFO", self.config.stream)
        self._stream_created = info.get("created")
        if self.config.deliver_policy == "all":
            self._position = 0
        elif self.config.deliver_policy == "by_start_sequence":
            self._position = max((self.config.start_seq or 1) - 1, 0)
        try:
            await self._attach(info)
        except BaseException:
            # Failed or cancelled part way (the gateway closing): what was made goes, here,
            # for every caller.
            await self._detach()
            raise
        if self._closed:  # closed while it was being created: nobody else will delete it
            await self._detach()
            return
        self._watchdog = asyncio.create_task(self._watch(), name=f"ordered-{self.config.stream}")

    async def close(self) -> None:
        """Stop: unsubscribe and delete the consumer now. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # A listener usually holds its consumer (a feed, a cache): let go of it, or the two
        # are a reference cycle, freed only by the garbage collector.
        self.listener = _CLOSED
        watchdog, self._watchdog = self._watchdog, None
        try:
            if watchdog is not None and watchdog is not asyncio.current_task():
                await cancel_and_wait(watchdog)
        finally:
            # Also when this close is itself cancelled meanwhile (a task of the caller's ended
            # by app.tasks.cancel_and_wait): the consumer and its subscription are let go.
            await self._detach()

    # -- consumers -------------------------------------------------------------------------

    def _consumer_config(self, inbox: str) -> dict[str, Any]:
        c = self.config
        config: dict[str, Any] = {
            "deliver_subject": inbox,
            "filter_subject": c.filter_subject,
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": int(c.idle_heartbeat * NS_PER_SECOND),
            "headers_only": c.headers_only,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": _INACTIVE_THRESHOLD_NS,
            "replay_policy": "instant",
        }
        if self._position is not None:
            # Where the last consumer left off (the first one: "all" or a resume point).
            config["deliver_policy"] = "by_start_sequence"
            config["opt_start_seq"] = self._position + 1
        else:
            config["deliver_policy"] = c.deliver_policy
        return config

    async def _attach(self, stream: dict[str, Any]) -> None:
        """Subscribe a fresh inbox, then create a consumer that delivers to it (``stream``:
        the stream's info, asked just before)."""
        self._generation += 1
        generation = self._generation
        client = self.js.pool.pick()
        inbox = client.new_inbox()
        # Deliveries wait until the consumer's starting point is known (on_start comes first).
        gate = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            await gate.wait()
            if generation == self._generation and not self._closed:
                await self._handle(client, inbox, msg)

        sub = await client.subscribe(inbox, cb=on_msg)
        body = {"stream_name": self.config.stream, "config": self._consumer_config(inbox)}
        try:
            # The consumer is created through whichever pooled connection the request takes,
            # and delivers at once: the server must have the inbox's SUB before it exists, or
            # the first deliveries go nowhere (a gap the consumer is recreated for).
            await self.js.pool.confirm(client, "consumer.subscribe")
            info = await self.js.call(
                "consumer.create", "CONSUMER", "CREATE", self.config.stream, body=body
            )
        except BaseException:
            await unsubscribe(sub)
            raise
        self._sub, self._consumer = sub, str(info["name"])
        self._expected = 1
        self._last_seen = self._loop.time()
        self._advisory = await self._watch_deletion(client, generation)
        # The stream's last sequence when the consumer runs on the server that led the stream
        # (and so had it all) when the info was asked, or on a lone server (whose consumers'
        # infos have no cluster); else 0: another replica may be behind (R1 consumers are
        # placed on any), and speaks for itself only (so does a replica answering the info
        # while the stream has no leader).
        leader = _server(stream)
        alone = "cluster" not in info
        on_leader = leader is not None and _server(info) == leader
        self.holds = _last_seq(stream) if alone or on_leader else 0
        num_pending = int(info.get("num_pending", 0))
        delivered = int((info.get("delivered") or {}).get("stream_seq", 0))
        if self._position is None and self.config.deliver_policy == "new":
            self._position = delivered
        position = self._position or 0
        if num_pending == 0:
            # Nothing in the filter up to the consumer's start: any point before it will do.
            position = max(position, delivered, self.holds)
        self.listener.on_start(num_pending, position)
        gate.set()

    async def _watch_deletion(self, client: Client, generation: int) -> Subscription | None:
        """The server announces a deleted consumer (and so a deleted stream) at once."""
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.DELETED.{self.config.stream}.{self._consumer}"

        async def on_advisory(_: Msg) -> None:
            if generation == self._generation:
                self._reset.set()

        try:
            return await client.subscribe(subject, cb=on_advisory)
        except nats.errors.Error:
            return None  # heartbeats still tell, only later

    async def _detach(self) -> None:
        sub, advisory, consumer = self._sub, self._advisory, self._consumer
        self._sub = self._advisory = self._consumer = None
        for subscription in (advisory, sub):
            if subscription is not None:
                await unsubscribe(subscription)
        if consumer is not None:
            with contextlib.suppress(errors.GatewayError):
                await self.js.call(
                    "consumer.delete", "CONSUMER", "DELETE", self.config.stream, consumer
                )

    # -- deliveries ------------------------------------------------------------------------

    async def _handle(self, client: Client, inbox: str, msg: Msg) -> None:
        self._last_seen = self._loop.time()
        if msg.subject == inbox:
            await self._control(client, msg)
            return
        try:
            message = delivery(msg)
        except errors.GatewayError:
            return
        if message.consumer_seq != self._expected:
            self._reset.set()  # a gap: re-create from the last stream sequence delivered
            return
        self._expected += 1
        self._position = message.stream_seq
        self.listener.on_message(message)

    async def _control(self, client: Client, msg: Msg) -> None:
        """Flow control requests and idle heartbeats (status 100 on the inbox)."""
        headers = msg.headers or {}
        replies = [msg.reply] if msg.reply else []
        if headers.get(_STALLED):
            replies.append(headers[_STALLED])
        for reply in replies:
            with contextlib.suppress(nats.errors.Error):
                await client.publish(reply, b"")
        last = headers.get(_LAST_CONSUMER)
        if last is not None and last.isdigit() and int(last) != self._expected - 1:
            self._reset.set()

    # -- recovery --------------------------------------------------------------------------

    async def _watch(self) -> None:
        heartbeat = self.config.idle_heartbeat
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reset.wait(), heartbeat)
            silent = self._loop.time() - self._last_seen > _MISSED_HEARTBEATS * heartbeat
            if self._closed or not (self._reset.is_set() or silent):
                continue
            self._reset.clear()
            try:
                await self._recover()
            except errors.GatewayError as exc:
                self._fail(exc)
                return

    async def _recover(self) -> None:
        """Re-create the consumer after the last delivered message, once the stream answers."""
        backoff = 0.25
        while not self._closed:
            try:
                await self._detach()  # first: the stream's info is then as fresh as at a start
                info = await self.js.call("stream.info", "STREAM", "INFO", self.config.stream)
                if info.get("created") != self._stream_created:
                    raise _stream_gone(self.config.stream)
                await self._attach(info)
                log.info("consumer on %s re-created at %s", self.config.stream, self._position)
                return
            except (errors.Unavailable, errors.Timeout) as exc:
                log.debug("consumer on %s waits for NATS: %s", self.config.stream, exc.detail)
            except (errors.StreamNotFound, errors.StreamDeleted):
                raise _stream_gone(self.config.stream) from None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _fail(self, error: errors.GatewayError) -> None:
        if not self._closed:
            self.listener.on_error(error)


def _server(info: dict[str, Any]) -> str | None:
    """The server that leads a stream or runs a consumer, as its info says (a lone server
    names itself as a stream's leader, and nothing for a consumer)."""
    leader = (info.get("cluster") or {}).get("leader")
    return leader if isinstance(leader, str) else None


def _last_seq(info: dict[str, Any]) -> int:
    return int((info.get("state") or {}).get("last_seq", 0))
