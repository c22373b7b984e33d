"""KV watches (ADR-8): one ordered consumer per watch, one bounded event queue per client.

The NATS side (:class:`app.nats.ordered.OrderedConsumer`) and the delivery side
(:class:`WatchSession`: filtering, encoding, the ``ready`` marker, the bounded queue) meet only
through the consumer's listener interface, so that one consumer could later feed several
sessions watching the same thing without either side being rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson

from app import errors, validation
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.scan import Delivery
from app.services import kv_model
from app.services.kv_model import PUT, Entry

log = logging.getLogger("jsgw.kv.watch")

EVENT_NAMES = {kv_model.PUT: "put", kv_model.DEL: "delete", kv_model.PURGE: "purge"}


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
                "kv.watch_invalid", "history and updates_only exclude each other"
            )
        # A browser reconnecting sends Last-Event-ID with the URL it first used: it wins.
        if last_event_id:
            since = kv_model.revision_of_tag(last_event_id)
            if since is None and last_event_id.strip() != "0":
                raise errors.InvalidInput(
                    "kv.last_event_id_invalid",
                    f"Last-Event-ID must be a revision (a whole number), got {last_event_id!r}",
                )
            since = since or 0
        return cls(key_filter, history, ignore_deletes, meta_only, updates_only, since)

    def consumer(self, bucket: str, idle_heartbeat: float) -> OrderedConfig:
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


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One SSE event: ``event``, ``id`` (a revision) and ``data`` (JSON)."""

    event: str
    id: str | None
    data: str


def entry_from_delivery(bucket: str, message: Delivery, *, meta_only: bool) -> Entry:
    return Entry(
        bucket=bucket,
        key=kv_model.key_of(bucket, message.subject),
        revision=message.stream_seq,
        created=kv_model.time_from_ns(message.timestamp_ns),
        operation=kv_model.operation_of(message.headers),
        value=None if meta_only else message.data,
        delta=message.pending,
    )


class WatchSession:
    """The events of one SSE client: a listener of the ordered consumer, and an async iterator.

    The queue holds at most ``queue_size`` events; a client that falls that far behind gets an
    ``error`` event and the end of the stream (it can resume with Last-Event-ID), and the NATS
    consumer behind it is stopped at once.
    """

    def __init__(
        self,
        bucket: str,
        options: WatchOptions,
        *,
        queue_size: int,
        visible: Callable[[str], bool] | None,
        on_closed: Callable[[WatchSession], None],
    ) -> None:
        self.bucket = bucket
        self.options = options
        self.feed: OrderedConsumer | None = None
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self._queue_size = queue_size
        self._visible = visible
        self._on_closed = on_closed
        self._ready = False
        self._ended = False
        self._stopping: asyncio.Task[None] | None = None

    # -- the listener side (called by the consumer, never blocks) ---------------------------

    def on_start(self, num_pending: int, position: int) -> None:
        if num_pending == 0:
            self._send_ready(position)

    def on_message(self, message: Delivery) -> None:
        if self._ended:
            return
        entry = entry_from_delivery(self.bucket, message, meta_only=self.options.meta_only)
        if self._wanted(entry):
            self._push(
                WatchEvent(
                    EVENT_NAMES[entry.operation],
                    str(entry.revision),
                    orjson.dumps(entry.to_json()).decode(),
                )
            )
        if message.pending == 0:
            self._send_ready(message.stream_seq)

    def on_error(self, error: errors.GatewayError) -> None:
        if error.code == "stream.deleted":
            error = errors.NotFound(
                "kv.bucket_deleted", f"bucket {self.bucket!r} was deleted: the watch ends"
            )
        self.end(error)

    def _wanted(self, entry: Entry) -> bool:
        if self.options.ignore_deletes and entry.operation != PUT:
            return False
        return self._visible is None or self._visible(entry.key)

    def _send_ready(self, position: int) -> None:
        """End Of Initial Data (ADR-8), once; its id resumes the watch right after it."""
        if self._ready or self._ended:
            return
        self._ready = True
        data = orjson.dumps({"revision": position}).decode()
        self._push(WatchEvent("ready", str(position), data))

    def _push(self, event: WatchEvent) -> None:
        if self._queue.qsize() >= self._queue_size:
            too_slow = errors.TooManyRequests(
                "kv.watch_too_slow",
                f"the client fell {self._queue_size} events behind: the watch ends; "
                "reconnect with Last-Event-ID to resume",
            )
            self.end(too_slow, drop=True)
            return
        self._queue.put_nowait(event)

    # -- the client side --------------------------------------------------------------------

    def end(self, error: errors.GatewayError | None = None, *, drop: bool = False) -> None:
        """Finish the stream (after an ``error`` event when given) and stop the consumer now.

        ``drop``: forget what the client has not read yet (it resumes from its last event id).
        """
        if self._ended:
            return
        self._ended = True
        while drop and not self._queue.empty():
            self._queue.get_nowait()
        if error is not None:
            self._queue.put_nowait(
                WatchEvent("error", None, orjson.dumps(error.problem()).decode())
            )
        self._queue.put_nowait(None)
        if self.feed is not None:
            self._stopping = asyncio.get_running_loop().create_task(self.feed.close())

    async def events(self) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self._queue.get()
            if event is None:
                return
            yield event

    async def close(self) -> None:
        """Release the NATS consumer and subscription. Idempotent."""
        if not self._ended:
            self._ended = True
            self._queue.put_nowait(None)
        if self.feed is not None:
            await self.feed.close()
        self._on_closed(self)


class Watches:
    """The live watches of the gateway: a cap on their number, and closing them on shutdown."""

    def __init__(
        self,
        js: JetStreamApi,
        *,
        limit: int,
        queue_size: int,
        idle_heartbeat: float,
        retry_after: int,
    ) -> None:
        self.js = js
        self.limit = limit
        self.queue_size = queue_size
        self.idle_heartbeat = idle_heartbeat
        self.retry_after = retry_after
        self._active: set[WatchSession] = set()

    def __len__(self) -> int:
        return len(self._active)

    async def open(
        self, bucket: str, options: WatchOptions, visible: Callable[[str], bool] | None
    ) -> WatchSession:
        """Start a watch; errors (bucket not found, ...) are raised before any event exists."""
        if len(self._active) >= self.limit:
            raise errors.TooManyRequests(
                "kv.too_many_watches",
                f"the gateway serves at most {self.limit} watches; retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        session = WatchSession(
            bucket,
            options,
            queue_size=self.queue_size,
            visible=visible,
            on_closed=self._active.discard,
        )
        config = options.consumer(bucket, self.idle_heartbeat)
        session.feed = OrderedConsumer(self.js, config, session)
        self._active.add(session)
        try:
            await session.feed.start()
        except BaseException:
            await session.close()
            raise
        return session

    async def close(self) -> None:
        """End every watch (the clients get an ``error`` event and may reconnect elsewhere)."""
        sessions = list(self._active)
        for session in sessions:
            session.end(
                errors.Unavailable("gateway.shutdown", "the gateway is shutting down; reconnect")
            )
        for session in sessions:
            with contextlib.suppress(errors.GatewayError):
                await session.close()
