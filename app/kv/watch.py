"""KV watches (ADR-8), fanned out: one NATS consumer per distinct (bucket, filter, meta_only),
shared by every SSE client watching it, and one bounded queue of pre-encoded events per client.

A :class:`Feed` is an ordered consumer that starts at the end of the bucket and delivers every
later change once; it encodes each change once and offers it to its sessions. A session that
needs the past first (the current values, ``history`` or ``since``; everything but
``updates_only``) catches up with an ordered consumer of its own while it queues what the feed
delivers. When the catch-up has sent everything up to revision Q (the ``ready`` event), the
session keeps the queued feed events after Q, drops its own consumer and lives on the feed:

- the session joined the feed at the feed's position P before its catch-up consumer existed,
  so every change after P reaches it through the feed;
- the catch-up consumer was created after that, so it sent every change up to P (or the later
  revision of the same key when ``last_per_subject`` skipped one): Q >= every revision <= P
  that matches the filter.

Both consumers are R1: the server places each on any replica of the stream, and a replica
may be behind the others (just after a partition it lacks what the leader committed last).
The catch-up's "nothing pending" then speaks for its replica only, and Q may stop short of P
(a client resuming after revision 55 would miss 56..58, which the feed passed before the
session joined it). So a ``ready`` that claims more than the catch-up delivered is checked
against the stream leader first: whatever the leader has in the filter up to the claim and P
that the catch-up did not deliver is read from the leader and sent before ``ready``.

So no revision is lost or sent twice. Catch-up consumers live a few milliseconds; at most
``catchup_limit`` exist at once per worker, so thousands of clients connecting together do not
run into the server's limit on consumers per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from app import errors, validation
from app.errors import ErrorCode
from app.kv import model as kv_model
from app.kv.model import PUT, Entry, entry_from_delivery, entry_from_message
from app.metrics import Metrics
from app.nats.direct import StoredMessage, leader_message
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.scan import Delivery
from app.sse import server_exiting

log = logging.getLogger("jsgw.kv.watch")

EVENT_NAMES = {kv_model.PUT: "put", kv_model.DEL: "delete", kv_model.PURGE: "purge"}
UPKEEP_INTERVAL = 0.5
SHUTDOWN = errors.Unavailable(ErrorCode.GATEWAY_SHUTDOWN, "the gateway is shutting down; reconnect")


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """What to watch and from where; ``since`` resumes after that revision (Last-Event-ID)."""

    key_filter: str = ">"
    history: bool = False
    ignore_deletes: bool = False
    meta_only: bool = False
    updates_only: bool = False
    since: int | None = None

    @classmethod
    def parse(
        cls,
        key: str | None,
        *,
        history: bool,
        ignore_deletes: bool,
        meta_only: bool,
        updates_only: bool,
        since: int | None,
        last_event_id: str | None,
    ) -> WatchOptions:
        key_filter = validation.kv_key_filter(key) if key else ">"
        if history and updates_only:
            raise errors.InvalidInput(
                ErrorCode.KV_WATCH_INVALID, "history and updates_only exclude each other"
            )
        # A browser reconnecting sends Last-Event-ID with the URL it first used: it wins.
        if last_event_id:
            text = last_event_id.strip()
            if len(text) >= 2 and text[0] == text[-1] == '"':
                text = text[1:-1]
            if not (text.isascii() and text.isdigit()):
                raise errors.InvalidInput(
                    ErrorCode.KV_LAST_EVENT_ID_INVALID,
                    f"Last-Event-ID must be a revision (a whole number), got {last_event_id!r}",
                )
            # (past 20 digits it is past any revision; int() of thousands of digits refuses)
            since = int(text) if len(text) <= 20 else kv_model.MAX_REVISION
        if since is not None and since >= kv_model.MAX_REVISION:
            raise errors.InvalidInput(
                ErrorCode.KV_WATCH_INVALID,
                "since / Last-Event-ID must be below 18446744073709551615",
            )
        return cls(key_filter, history, ignore_deletes, meta_only, updates_only, since)

    @property
    def needs_catchup(self) -> bool:
        """Everything but ``updates_only`` starts with stored revisions."""
        return not self.updates_only or self.since is not None

    def consumer(self, bucket: str, idle_heartbeat: float) -> OrderedConfig:
        """The consumer that sends what this watch wants from the past (its catch-up)."""
        if self.since is not None:
            policy, start = "by_start_sequence", self.since + 1
        elif self.history:
            policy, start = "all", None
        elif self.updates_only:
            policy, start = "new", None
        else:
            policy, start = "last_per_subject", None
        return OrderedConfig(
            stream=kv_model.stream_name(bucket),
            filter_subject=kv_model.filter_subject(bucket, self.key_filter),
            deliver_policy=policy,
            start_seq=start,
            headers_only=self.meta_only,
            idle_heartbeat=idle_heartbeat,
        )

    def feed(self, bucket: str, idle_heartbeat: float) -> OrderedConfig:
        """The shared consumer: every change from now on."""
        return OrderedConfig(
            stream=kv_model.stream_name(bucket),
            filter_subject=kv_model.filter_subject(bucket, self.key_filter),
            deliver_policy="new",
            headers_only=self.meta_only,
            idle_heartbeat=idle_heartbeat,
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One SSE event: ``event``, ``id`` (a revision) and ``data`` (JSON); ``wire`` is the
    encoded event, made once however many clients it goes to."""

    event: str
    id: str | None
    data: str
    wire: bytes = field(default=b"", compare=False, repr=False)

    @classmethod
    def make(cls, event: str, id: str | None, data: str) -> WatchEvent:
        head = f"event: {event}\r\n" + (f"id: {id}\r\n" if id is not None else "")
        return cls(event, id, data, f"{head}data: {data}\r\n\r\n".encode())


PING = WatchEvent("", None, "", b": ping\r\n\r\n")


def entry_event(entry: Entry) -> WatchEvent:
    return WatchEvent.make(
        EVENT_NAMES[entry.operation], str(entry.revision), orjson.dumps(entry.to_json()).decode()
    )


class WatchSession:
    """The events of one SSE client.

    It listens to its catch-up consumer (``on_start``/``on_message``/``on_error``) until the
    ``ready`` marker, then to its feed (``on_feed``). The queue holds at most ``queue_size``
    events; a client that falls that far behind gets an ``error`` event and the end of the
    stream (it can resume with Last-Event-ID), and leaves the feed at once.
    """

    # Slots, not an instance dict: one session per watcher, thousands per worker.
    __slots__ = (
        "_backlog",
        "_catchup_done",
        "_checking",
        "_closed",
        "_ended",
        "_leader_next",
        "_on_closed",
        "_on_replica_behind",
        "_on_too_slow",
        "_queue",
        "_queue_size",
        "_ready",
        "_stopping",
        "_through",
        "_visible",
        "_waiter",
        "bucket",
        "catchup",
        "cut_off",
        "feed",
        "joined",
        "options",
        "sending_since",
        "writer",
    )

    def __init__(
        self,
        bucket: str,
        options: WatchOptions,
        *,
        queue_size: int,
        visible: Callable[[str], bool] | None,
        on_closed: Callable[[WatchSession], None],
        on_too_slow: Callable[[], None] | None = None,
        leader_next: Callable[[str, str, int], Awaitable[StoredMessage | None]] | None = None,
        on_replica_behind: Callable[[], None] | None = None,
    ) -> None:
        self.bucket = bucket
        self.options = options
        self.feed: Feed | None = None
        # The feed's position when the session joined it: every later change reaches the
        # session through the feed, every earlier one must come from the catch-up.
        self.joined = 0
        # The stream leader's first message in a filter at or after a sequence (stream,
        # filter subject, sequence; one callable shared by all sessions): what a ready that
        # claims more than the catch-up delivered is checked against (None: the catch-up is
        # believed).
        self._leader_next = leader_next
        # Called when the leader had what the catch-up did not deliver.
        self._on_replica_behind = on_replica_behind
        self._checking: asyncio.Task[None] | None = None
        self.catchup: OrderedConsumer | None = None
        self._catchup_done: Callable[[], None] | None = None
        # The client's events (None: the end, always last), and the writer waiting for them,
        # if it waits. A list: empty nearly always, where a deque's first block is ~600 bytes
        # per watcher; the writer takes it whole.
        self._queue: list[WatchEvent | None] = []
        self._waiter: asyncio.Future[None] | None = None
        self._queue_size = queue_size
        self._visible = visible
        self._on_closed = on_closed
        self._on_too_slow = on_too_slow
        # Feed events that arrive while catching up; None once live on the feed.
        self._backlog: list[tuple[Entry, WatchEvent]] | None = []
        self._ready = False
        # The highest revision the client has been given or skipped (or resumed after):
        # nothing at or below it is sent again, and ``ready`` never names a lower one. A
        # consumer on a replica behind the others (as after a partition) may report a
        # position, or deliver revisions, that the client has already had.
        self._through = options.since or 0
        self._ended = False
        self._closed = False
        # The stop of the catch-up consumer while it runs (kept only that long).
        self._stopping: asyncio.Task[None] | None = None
        # The writer of the HTTP response: since when it waits for a send (0: it does not).
        self.sending_since = 0.0
        self.writer: asyncio.Task[object] | None = None
        self.cut_off = False

    @property
    def ended(self) -> bool:
        return self._ended

    # -- the catch-up side (the session's own consumer) -------------------------------------

    def on_start(self, num_pending: int, position: int) -> None:
        if num_pending == 0 and self._backlog is not None:
            self._send_ready(position)

    def on_message(self, message: Delivery) -> None:
        if self._ended or self._backlog is None or self._checking is not None:
            return  # the feed has taken over, or the leader is asked for the rest
        entry = entry_from_delivery(self.bucket, message, meta_only=self.options.meta_only)
        if self._new(entry) and self._wanted(entry):
            self._push(entry_event(entry))
        if message.pending == 0:
            self._send_ready(message.stream_seq)

    def on_error(self, error: errors.GatewayError) -> None:
        if isinstance(error, errors.StreamDeleted | errors.StreamNotFound):
            error = errors.NotFound(
                ErrorCode.KV_BUCKET_DELETED, f"bucket {self.bucket!r} was deleted: the watch ends"
            )
        self.end(error)

    async def catch_up(self, consumer: OrderedConsumer, done: Callable[[], None]) -> None:
        """Start the catch-up consumer; ``done`` runs once it is stopped (its slot)."""
        self.catchup, self._catchup_done = consumer, done
        if self._ended:  # cut off while it waited for a slot: the writer sends the end
            self._stop_catchup()
            return
        await consumer.start()

    def live_from(self, position: int) -> None:
        """No catch-up (``updates_only``): ready at the feed's position, live at once."""
        self._ready_at(position)

    def _send_ready(self, position: int) -> None:
        """End Of Initial Data (ADR-8), once; its id resumes the watch right after it.

        The catch-up claims everything in the filter up to ``position`` was delivered. When
        that, or the feed's position at the join, is past what it did deliver, the rest is
        read from the stream leader first (:meth:`_from_leader`)."""
        if self._ready or self._ended or self._checking is not None:
            return
        claimed = max(position, self.joined)
        # What the catch-up has covered: what it delivered (or the resume point), and, with
        # nothing pending, all its server held when it was made (the stream's last sequence
        # on the stream leader, app.nats.ordered).
        held = 0 if self.catchup is None else self.catchup.holds
        if self._leader_next is not None and claimed > max(self._through, held):
            # The leader answers for the rest. The catch-up's slot (catchup_limit) is kept
            # until it has: a replica behind keeps many watches reading from the leader.
            slot, self._catchup_done = self._catchup_done, None
            self._stop_catchup()
            task = asyncio.get_running_loop().create_task(self._from_leader(claimed))
            if slot is not None:  # (also when cancelled before it ran)
                task.add_done_callback(lambda _: slot())
            self._checking = task
            return
        self._ready_at(position)

    async def _from_leader(self, claimed: int) -> None:
        """What the leader has in the filter after the catch-up's last delivery, up to
        ``claimed``, sent in order; then ``ready``. A leader that cannot be asked ends the
        watch with its error: the client resumes after the last revision it was sent."""
        assert self._leader_next is not None
        stream = kv_model.stream_name(self.bucket)
        subject = kv_model.filter_subject(self.bucket, self.options.key_filter)
        behind = True  # counted once, at the first message the catch-up lacked
        try:
            while not self._ended:
                message = await self._leader_next(stream, subject, self._through + 1)
                if message is None or message.seq > claimed:
                    break
                if message.seq <= self._through:  # (never from a sound server: no loop)
                    raise errors.UpstreamError(
                        ErrorCode.JETSTREAM_BAD_RESPONSE,
                        f"the stream leader answered revision {message.seq} for one after "
                        f"{self._through}",
                    )
                if behind:
                    behind = False
                    log.info(
                        "a watch of %s caught up on a replica that lacks revision %d: the "
                        "rest up to %d is read from the stream leader",
                        self.bucket,
                        message.seq,
                        claimed,
                    )
                    if self._on_replica_behind is not None:
                        self._on_replica_behind()
                entry = entry_from_message(self.bucket, message)
                if self.options.meta_only:
                    entry = dataclasses.replace(entry, value=None)
                if self._new(entry) and self._wanted(entry):
                    self._push(entry_event(entry))
        except errors.GatewayError as exc:
            self.on_error(exc)
            return
        except Exception:
            log.exception("reading a watch's revisions from the stream leader failed")
            self.end(
                errors.UpstreamError(
                    ErrorCode.JETSTREAM_BAD_RESPONSE, "the stream leader's answer was not read"
                )
            )
            return
        finally:
            self._checking = None
        self._ready_at(claimed)

    def _ready_at(self, position: int) -> None:
        if self._ready or self._ended:
            return
        self._ready = True
        position = self._through = max(position, self._through)
        data = orjson.dumps({"revision": position}).decode()
        self._push(WatchEvent.make("ready", str(position), data))
        backlog, self._backlog = self._backlog or [], None
        for entry, event in backlog:
            if entry.revision > position:
                self._offer(entry, event)
        self._stop_catchup()

    # -- the feed side -------------------------------------------------------------------------

    def on_feed(self, entry: Entry, event: WatchEvent) -> None:
        if self._ended:
            return
        backlog = self._backlog
        if backlog is None:
            self._offer(entry, event)
        elif len(backlog) >= self._queue_size:
            self._too_slow()
        else:
            backlog.append((entry, event))

    def _offer(self, entry: Entry, event: WatchEvent) -> None:
        if self._new(entry) and self._wanted(entry):
            self._push(event)

    def _new(self, entry: Entry) -> bool:
        """Whether the entry is past everything the client has had (and now counts as had)."""
        if entry.revision <= self._through:
            return False
        self._through = entry.revision
        return True

    def _wanted(self, entry: Entry) -> bool:
        if self.options.ignore_deletes and entry.operation != PUT:
            return False
        return self._visible is None or self._visible(entry.key)

    def _push(self, event: WatchEvent) -> None:
        if len(self._queue) >= self._queue_size:
            self._too_slow()
            return
        self._put(event)

    def _put(self, event: WatchEvent | None) -> None:
        self._queue.append(event)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _too_slow(self) -> None:
        if self._ended:
            return
        if self._on_too_slow is not None:
            self._on_too_slow()
        too_slow = errors.TooManyRequests(
            ErrorCode.KV_WATCH_TOO_SLOW,
            f"the client fell {self._queue_size} events behind: the watch ends; "
            "reconnect with Last-Event-ID to resume",
        )
        self.end(too_slow, drop=True)

    def ping(self) -> None:
        """A heartbeat comment, unless events are on their way anyway."""
        if not self._ended and not self._queue:
            self._put(PING)

    # -- the client side --------------------------------------------------------------------

    def end(self, error: errors.GatewayError | None = None, *, drop: bool = False) -> None:
        """Finish the stream (after an ``error`` event when given) and leave NATS now.

        ``drop``: forget what the client has not read yet (it resumes from its last event id).
        """
        if self._ended:
            return
        self._ended = True
        if drop:
            self._queue.clear()
        if error is not None:
            self._put(WatchEvent.make("error", None, orjson.dumps(error.problem()).decode()))
        self._put(None)
        self._leave()

    def _leave(self) -> None:
        self._backlog = None
        self._stop_catchup()
        checking = self._checking
        if checking is not None and checking is not asyncio.current_task():
            checking.cancel()
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.remove(self)

    def _stop_catchup(self) -> None:
        catchup, self.catchup = self.catchup, None
        done, self._catchup_done = self._catchup_done, None
        if catchup is None and done is None:
            return

        async def stop() -> None:
            try:
                if catchup is not None:
                    await catchup.close()
            finally:
                if done is not None:
                    done()

        task = self._stopping = asyncio.get_running_loop().create_task(stop())
        task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if self._stopping is task:
            self._stopping = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, errors.GatewayError):
            log.error("stopping the catch-up consumer of a watch failed", exc_info=error)

    async def _wait(self) -> list[WatchEvent | None]:
        queue = self._queue
        while not queue:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            queue = self._queue
        return queue

    async def next_chunk(self) -> bytes | None:
        """The encoded events waiting (at least one), or None at the end of the stream."""
        queue = await self._wait()
        if queue[-1] is None:  # the end: what comes before it, then None
            self._queue = [None]
            queue.pop()
            if not queue:
                return None
        else:
            self._queue = []
        if len(queue) == 1:
            return queue[0].wire  # type: ignore[union-attr]
        return b"".join(event.wire for event in queue)  # type: ignore[union-attr]

    async def events(self) -> AsyncIterator[WatchEvent]:
        while (queue := await self._wait())[0] is not None:
            yield queue.pop(0)  # type: ignore[misc]

    async def close(self) -> None:
        """Leave the feed and release the catch-up consumer. Idempotent."""
        if not self._ended:
            self._ended = True
            self._put(None)
        self._leave()
        try:
            if (stopping := self._stopping) is not None:
                with contextlib.suppress(errors.GatewayError):
                    await stopping
        finally:
            if not self._closed:
                self._closed = True
                self._on_closed(self)


class Feed:
    """One ordered consumer from the end of a bucket (a filter, meta_only or not), offering
    every change, encoded once, to the sessions that watch it."""

    def __init__(
        self, js: JetStreamApi, bucket: str, config: OrderedConfig, on_empty: Callable[[Feed], None]
    ) -> None:
        self.bucket = bucket
        self.meta_only = config.headers_only
        self.sessions: set[WatchSession] = set()
        self.consumer = OrderedConsumer(js, config, self)
        self.position = 0
        self.started: asyncio.Task[None] | None = None
        self.waiting = 0  # clients waiting for the start
        self.failed = False
        self._on_empty = on_empty

    def add(self, session: WatchSession) -> int:
        """Join; every change after the returned position reaches the session."""
        self.sessions.add(session)
        session.feed = self
        return self.position

    def remove(self, session: WatchSession) -> None:
        self.sessions.discard(session)
        if not self.sessions and not self.waiting:
            self._on_empty(self)

    # -- the consumer's listener ---------------------------------------------------------------

    def on_start(self, num_pending: int, position: int) -> None:
        self.position = max(self.position, position)

    def on_message(self, message: Delivery) -> None:
        self.position = message.stream_seq
        entry = entry_from_delivery(self.bucket, message, meta_only=self.meta_only)
        event = entry_event(entry)
        for session in list(self.sessions):
            session.on_feed(entry, event)

    def on_error(self, error: errors.GatewayError) -> None:
        self.failed = True
        for session in list(self.sessions):
            session.on_error(error)


FeedKey = tuple[str, str, bool]


def _leader_next(
    js: JetStreamApi, stream: str, subject: str, seq: int
) -> Awaitable[StoredMessage | None]:
    """The stream leader's first message on ``subject`` (a filter) at or after ``seq``."""
    request = {"seq": seq, "next_by_subj": subject}
    return leader_message(js, stream, request, operation="kv.watch")


class Watches:
    """The live watches of a worker: their feeds, a cap on their number, heartbeats, cutting
    off writers stuck on a client that reads nothing, and a farewell on shutdown."""

    def __init__(
        self,
        js: JetStreamApi,
        *,
        limit: int,
        queue_size: int,
        idle_heartbeat: float,
        retry_after: int,
        ping_interval: float = 15.0,
        send_timeout: float = 60.0,
        catchup_limit: int = 32,
        metrics: Metrics | None = None,
    ) -> None:
        self.js = js
        # (One for every session: a partial per session was 208 bytes of each watcher.)
        self._leader_next = functools.partial(_leader_next, js)
        self.limit = limit
        self.queue_size = queue_size
        self.idle_heartbeat = idle_heartbeat
        self.retry_after = retry_after
        self.ping_interval = ping_interval
        self.send_timeout = send_timeout
        self._upkeep: asyncio.Task[None] | None = None
        self._active: set[WatchSession] = set()
        self._feeds: dict[FeedKey, Feed] = {}
        self._catchups = asyncio.Semaphore(catchup_limit)
        self._closing: set[asyncio.Task[None]] = set()
        self._metrics = metrics
        if metrics is not None:
            metrics.kv_watches_limit.set(limit)
            metrics.gauge_function(metrics.kv_watches_open, lambda: len(self._active))
            self._refused = metrics.sse_streams_refused.labels("kv_watches")
            self._behind = metrics.kv_watches_dropped.labels("behind")
            self._stuck = metrics.kv_watches_dropped.labels("stuck")

    def __len__(self) -> int:
        return len(self._active)

    async def open(
        self, bucket: str, options: WatchOptions, visible: Callable[[str], bool] | None
    ) -> WatchSession:
        """Start a watch; errors (bucket not found, ...) are raised before any event exists."""
        if len(self._active) >= self.limit:
            if self._metrics is not None:
                self._refused.inc()
            raise errors.TooManyRequests(
                ErrorCode.KV_TOO_MANY_WATCHES,
                f"the gateway serves at most {self.limit} watches; retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        session = WatchSession(
            bucket,
            options,
            queue_size=self.queue_size,
            visible=visible,
            on_closed=self._closed,
            on_too_slow=None if self._metrics is None else self._behind.inc,
            on_replica_behind=None if self._metrics is None else self._metrics.kv_stale_reads.inc,
            leader_next=self._leader_next,
        )
        self._active.add(session)
        self._changed()
        if self._upkeep is None:
            self._upkeep = asyncio.get_running_loop().create_task(self._keep_up())
        try:
            feed = await self._feed(bucket, options)
            position = session.joined = feed.add(session)
            if not options.needs_catchup:
                session.live_from(position)
                return session
            await self._catchups.acquire()
            consumer = OrderedConsumer(
                self.js, options.consumer(bucket, self.idle_heartbeat), session
            )
            await session.catch_up(consumer, self._catchups.release)
        except BaseException:
            with contextlib.suppress(errors.GatewayError):
                await session.close()
            raise
        return session

    def _closed(self, session: WatchSession) -> None:
        self._active.discard(session)
        self._changed()

    def _changed(self) -> None:
        if self._metrics is not None:
            self._metrics.refresh()  # (computed gauges, with several workers)

    async def _feed(self, bucket: str, options: WatchOptions) -> Feed:
        """The started feed of this (bucket, filter, meta_only), started here if need be."""
        config = options.feed(bucket, self.idle_heartbeat)
        key = (bucket, config.filter_subject, config.headers_only)
        feed = self._feeds.get(key)
        if feed is None or feed.failed:
            feed = Feed(self.js, bucket, config, lambda f: self._drop(key, f))
            self._feeds[key] = feed
            feed.started = asyncio.get_running_loop().create_task(feed.consumer.start())
        assert feed.started is not None
        feed.waiting += 1
        try:
            # Shielded: one client leaving must not stop the start others wait for.
            await asyncio.shield(feed.started)
        except BaseException:
            feed.waiting -= 1
            if not feed.waiting and not feed.sessions:
                self._drop(key, feed)  # a failed start, or every client left while it ran
            raise
        feed.waiting -= 1
        return feed

    def _drop(self, key: FeedKey, feed: Feed) -> None:
        """The last client left (or the start failed): stop the feed's consumer."""
        if self._feeds.get(key) is feed:
            del self._feeds[key]
        task = asyncio.get_running_loop().create_task(self._stop_feed(feed))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _stop_feed(feed: Feed) -> None:
        if feed.started is not None and not feed.started.done():
            with contextlib.suppress(BaseException):
                await feed.started
        with contextlib.suppress(errors.GatewayError):
            await feed.consumer.close()

    # -- upkeep: one timer for all watches ------------------------------------------------------

    async def _keep_up(self) -> None:
        """Heartbeats, writers stuck on a client that reads nothing, the farewell on shutdown
        (when the HTTP server starts to exit it waits for open streams, so they must end)."""
        loop = asyncio.get_running_loop()
        last_ping = loop.time()
        try:
            while self._active:
                await asyncio.sleep(UPKEEP_INTERVAL)
                now = loop.time()
                if server_exiting():
                    self.end_all(SHUTDOWN)
                if now - last_ping >= self.ping_interval:
                    last_ping = now
                    for session in list(self._active):
                        session.ping()
                self._cut_off_stuck(now)
        finally:
            self._upkeep = None

    def _cut_off_stuck(self, now: float) -> None:
        for session in list(self._active):
            since = session.sending_since
            if since and now - since > self.send_timeout and session.writer is not None:
                if self._metrics is not None and not session.ended:
                    self._stuck.inc()
                session.cut_off = True
                session.end()
                session.writer.cancel()

    def end_all(self, error: errors.GatewayError) -> None:
        for session in list(self._active):
            session.end(error)

    async def close(self) -> None:
        """End every watch (the clients get an ``error`` event and may reconnect elsewhere)."""
        sessions = list(self._active)
        self.end_all(SHUTDOWN)
        for session in sessions:
            with contextlib.suppress(errors.GatewayError):
                await session.close()
        upkeep, self._upkeep = self._upkeep, None
        if upkeep is not None:
            upkeep.cancel()
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task
