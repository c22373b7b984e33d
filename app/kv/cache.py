"""An opt-in read cache for KV buckets (``JSGW_KV_CACHE``), fed by a watch of each bucket.

Each cached bucket has one ordered consumer (``last_per_subject`` on every key, then every
change) whose deliveries keep the latest entry of every key in memory, deletes included. A
latest-value GET is answered from memory while the cache is *live*:

- the initial values have all arrived;
- the consumer has delivered a message or an idle heartbeat within two heartbeat intervals
  (``JSGW_KV_WATCH_HEARTBEAT``, 5 s by default), so the server is known to be pushing changes;
- the bucket holds at most ``JSGW_KV_CACHE_MAX_BYTES`` of values;
- a check of the stream's state, made every heartbeat interval, has passed within two.

Otherwise the GET goes to NATS as without a cache. Staleness: a cached answer misses only the
changes still on their way from the server to the gateway (the delivery lag of a push
consumer: typically well under a millisecond on a LAN; if deliveries stop, the cache stops
answering after at most two heartbeat intervals). A write through this gateway process is never
missed by its own later reads: the written revision is remembered until the feed delivers it,
and reads of that key go to NATS until then (nor is an entry older than what the process has
already served for its key answered: see KVService.get). Entries with a TTL (per key, or the
bucket's ``max_age``) are not answered from memory once expired. Reads of a revision
(``?revision=``), history and listings never use the cache.

Purges. A stream purge made by other means than the KV API (``purge_stream``, with or without
a subject filter, ``purge_deletes``) removes messages without a word to consumers. What it
removes a cache can still notice: the last message of a key, so one subject fewer in the
stream. The check compares the stream's ``num_subjects`` with the keys the cache holds as of
the stream's ``last_seq`` in the same answer (keys that first arrived after it are not
counted: :attr:`BucketCache._arrivals`), leaving out keys whose TTL ends within
``_EXPIRY_MARGIN_NS`` (the server removes those on its own clock). Every key the cache counts
is a subject of the stream unless something removed it behind the consumer's back, so more
keys than subjects means a purge: the cache starts over (reads go to NATS until it has
reloaded). A purge and, within the same interval, a new key not yet delivered cancel out in
one check; the next one sees the purge. So a purge is seen within two heartbeat intervals,
and while the checks fail the cache does not answer. Not seen: deleting one message by its
sequence (not a KV operation) while older revisions of its key remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from typing import Any

from app import errors
from app.durations import NS_PER_SECOND, parse_duration_ns
from app.kv import model as kv_model
from app.kv.model import Entry
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.scan import Delivery
from app.tasks import cancel_and_wait

log = logging.getLogger("jsgw.kv.cache")

_RETRY = 2.0
# Keys whose TTL ends this soon are not counted against the stream's subjects: the server may
# have removed them already (its clock is not the gateway's).
_EXPIRY_MARGIN_NS = 2 * NS_PER_SECOND
# New keys remembered by the revision they arrived at (see BucketCache._vanished); a check whose
# answer is older than what is remembered cannot decide, and the next one tries again.
_ARRIVALS = 10_000


class BucketCache:
    """The latest entry of every key of one bucket; a listener of its ordered consumer."""

    def __init__(self, js: JetStreamApi, bucket: str, heartbeat: float, max_bytes: int) -> None:
        self.js = js
        self.bucket = bucket
        self.heartbeat = heartbeat
        self.max_bytes = max_bytes
        self.entries: dict[str, Entry] = {}
        # When entries with a TTL (per key, ADR-43, or the bucket's max_age) expire, in ns since
        # the epoch: the server removes them without telling consumers.
        self.expires: dict[str, int] = {}
        self.max_age_ns = 0
        self.size = 0
        self.ready = False
        self.too_big = False
        # Revisions written through this process that the feed has not delivered yet.
        self._floors: dict[str, int] = {}
        # What the purge check counts (see the module docstring): keys whose TTL ends soon or
        # has ended, found through a heap of (expiry, key) (lazily cleaned), and the keys that
        # joined the count (revision, key) since the last check's stream answer.
        self._expiring: set[str] = set()
        self._expiry_heap: list[tuple[int, str]] = []
        self._arrivals: deque[tuple[int, str]] = deque()
        self._arrivals_floor = 0  # arrivals at or before this revision are forgotten
        self._checked_at = float("-inf")  # when the last check passed (time.monotonic())
        self._consumer: OrderedConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kv-cache-{self.bucket}"
        )

    async def _run(self) -> None:
        """Keep a consumer on the bucket; start again (empty) when the bucket goes and comes."""
        config = OrderedConfig(
            stream=kv_model.stream_name(self.bucket),
            filter_subject=kv_model.filter_subject(self.bucket, ">"),
            deliver_policy="last_per_subject",
            idle_heartbeat=self.heartbeat,
        )
        while True:
            self._reset()
            consumer = OrderedConsumer(self.js, config, self)
            try:
                info = await self.js.call("stream.info", "STREAM", "INFO", config.stream)
                self.max_age_ns = int((info.get("config") or {}).get("max_age") or 0)
                await consumer.start(info)
            except errors.GatewayError as exc:
                log.debug("cache of bucket %r not started: %s", self.bucket, exc.detail)
                await asyncio.sleep(_RETRY)
                continue
            self._consumer = consumer
            self._checked_at = time.monotonic()  # the stream info above, as of before the start
            log.info("caching bucket %r", self.bucket)
            try:
                await self._check_until_failed(config.stream)
            finally:
                self._consumer = None
                with contextlib.suppress(errors.GatewayError):
                    await consumer.close()

    async def _check_until_failed(self, stream: str) -> None:
        """Return when the feed fails, or when the stream lost keys the cache holds; check that
        every heartbeat interval."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._failed.wait(), self.heartbeat)
            if self._failed.is_set():
                return
            try:
                # (Its own label in the NATS latency metrics: not a read's request.)
                info = await self.js.call("kv.cache_check", "STREAM", "INFO", stream)
            except errors.GatewayError as exc:
                # Not answering from memory after two intervals of this (see live); a deleted
                # stream is the consumer's to report.
                log.debug("cache of bucket %r not checked: %s", self.bucket, exc.detail)
                continue
            vanished = self._vanished(info.get("state") or {})
            if vanished:
                log.info(
                    "bucket %r lost keys its cache holds (a purge by other means than the KV "
                    "API?): reloading it",
                    self.bucket,
                )
                return
            if vanished is not None:
                self._checked_at = time.monotonic()

    def _vanished(self, state: dict[str, Any]) -> bool | None:
        """Does the cache hold more keys than the stream has subjects (None: cannot tell)?"""
        last_seq = int(state.get("last_seq") or 0)
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= last_seq:
            arrivals.popleft()
        if self._arrivals_floor > last_seq:
            return None  # keys arrived after the answer and are forgotten: next time
        self._mark_expiring()
        held = len(self.entries) - len(self._expiring) - len(arrivals)
        return held > int(state.get("num_subjects") or 0)

    def _mark_expiring(self) -> None:
        heap = self._expiry_heap
        soon = time.time_ns() + _EXPIRY_MARGIN_NS
        while heap and heap[0][0] <= soon:
            expires, key = heapq.heappop(heap)
            if self.expires.get(key) == expires:
                self._expiring.add(key)
        if len(heap) > 2 * len(self.expires) + 64:  # mostly superseded expiries: rebuilt
            heap[:] = [(t, k) for k, t in self.expires.items() if k not in self._expiring]
            heapq.heapify(heap)

    def _reset(self) -> None:
        self.entries.clear()
        self.expires.clear()
        self._floors.clear()
        self._expiring.clear()
        self._expiry_heap.clear()
        self._arrivals.clear()
        self._arrivals_floor = 0
        self._checked_at = float("-inf")
        self.size = 0
        self.ready = self.too_big = False
        self._failed.clear()

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # -- the consumer's listener ---------------------------------------------------------------

    def on_start(self, num_pending: int, position: int) -> None:
        if num_pending == 0:
            self.ready = True

    def on_message(self, message: Delivery) -> None:
        entry = kv_model.entry_from_delivery(self.bucket, message, delta=0)
        old = self.entries.get(entry.key)
        self.size += len(message.data) - (len(old.value or b"") if old is not None else 0)
        self.entries[entry.key] = entry
        if old is None or entry.key in self._expiring:
            self._arrived(entry.revision, entry.key)
            self._expiring.discard(entry.key)
        ttl_ns = self._ttl_ns(message)
        if ttl_ns:
            expires = self.expires[entry.key] = message.timestamp_ns + ttl_ns
            heapq.heappush(self._expiry_heap, (expires, entry.key))
        else:
            self.expires.pop(entry.key, None)
        floor = self._floors.get(entry.key)
        if floor is not None and entry.revision >= floor:
            del self._floors[entry.key]
        if self.size > self.max_bytes and not self.too_big:
            self.too_big = True
            log.warning(
                "bucket %r holds more than %d bytes: its reads are no longer cached",
                self.bucket,
                self.max_bytes,
            )
        if message.pending == 0:
            self.ready = True

    def _arrived(self, revision: int, key: str) -> None:
        arrivals = self._arrivals
        if len(arrivals) >= _ARRIVALS:
            self._arrivals_floor = arrivals.popleft()[0]
        arrivals.append((revision, key))

    def _ttl_ns(self, message: Delivery) -> int:
        ttl = (message.headers or {}).get(kv_model.TTL_HEADER)
        if ttl is None:
            return self.max_age_ns
        if ttl.strip().lower() == "never":
            return 0
        try:
            return parse_duration_ns(ttl) or self.max_age_ns
        except ValueError:
            return 1  # unknown form: treat as expired, let NATS answer

    def on_error(self, error: errors.GatewayError) -> None:
        log.info("cache of bucket %r stopped: %s", self.bucket, error.detail)
        self._failed.set()

    # -- reads and writes ----------------------------------------------------------------------

    @property
    def live(self) -> bool:
        consumer = self._consumer
        return (
            self.ready
            and not self.too_big
            and consumer is not None
            and consumer.silent_for() <= 2 * self.heartbeat
            and time.monotonic() - self._checked_at <= 2 * self.heartbeat
        )

    def lookup(self, key: str) -> tuple[bool, Entry | None]:
        """(True, latest entry or None for a key never written) when the cache may answer."""
        if not self.live or key in self._floors:
            return False, None
        expires = self.expires.get(key)
        if expires is not None and time.time_ns() >= expires:
            return False, None
        return True, self.entries.get(key)

    def written(self, key: str, revision: int) -> None:
        if revision > self._floors.get(key, 0):
            current = self.entries.get(key)
            if current is None or current.revision < revision:
                self._floors[key] = revision


class ReadCaches:
    def __init__(self, js: JetStreamApi, buckets: list[str], heartbeat: float, max_bytes: int):
        self.caches = {b: BucketCache(js, b, heartbeat, max_bytes) for b in buckets}

    def start(self) -> None:
        for cache in self.caches.values():
            cache.start()

    def lookup(self, bucket: str, key: str) -> tuple[bool, Entry | None]:
        cache = self.caches.get(bucket)
        return (False, None) if cache is None else cache.lookup(key)

    def written(self, bucket: str, key: str, revision: int) -> None:
        cache = self.caches.get(bucket)
        if cache is not None:
            cache.written(key, revision)

    async def close(self) -> None:
        for cache in self.caches.values():
            await cache.close()
