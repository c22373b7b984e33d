"""An opt-in read cache for KV buckets (``JSGW_KV_CACHE``), fed by a watch of each bucket.

Each cached bucket has one ordered consumer (``last_per_subject`` on every key, then every
change) whose deliveries keep the latest entry of every key in memory, deletes included. A
latest-value GET is answered from memory while the cache is *live*:

- the initial values have all arrived;
- the consumer has delivered a message or an idle heartbeat within two heartbeat intervals
  (``JSGW_KV_WATCH_HEARTBEAT``, 5 s by default), so the server is known to be pushing changes;
- the bucket holds at most ``JSGW_KV_CACHE_MAX_BYTES`` of values.

Otherwise the GET goes to NATS as without a cache. Staleness: a cached answer misses only the
changes still on their way from the server to the gateway (the delivery lag of a push
consumer: typically well under a millisecond on a LAN; if deliveries stop, the cache stops
answering after at most two heartbeat intervals). A write through this gateway process is never
missed by its own later reads: the written revision is remembered until the feed delivers it,
and reads of that key go to NATS until then. Entries with a TTL (per key, or the bucket's
``max_age``) are not answered from memory once expired. Reads of a revision (``?revision=``),
history and listings never use the cache. Not seen: a purge of the whole stream by other means
than the KV API (the server tells consumers nothing); restart the gateway after one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app import errors
from app.durations import parse_duration_ns
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.scan import Delivery
from app.services import kv_model
from app.services.kv_model import Entry

log = logging.getLogger("jsgw.kv.cache")

_RETRY = 2.0


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
            log.info("caching bucket %r", self.bucket)
            try:
                await self._failed.wait()
            finally:
                self._consumer = None
                with contextlib.suppress(errors.GatewayError):
                    await consumer.close()

    def _reset(self) -> None:
        self.entries.clear()
        self.expires.clear()
        self._floors.clear()
        self.size = 0
        self.ready = self.too_big = False
        self._failed.clear()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the consumer's listener ---------------------------------------------------------------

    def on_start(self, num_pending: int, position: int) -> None:
        if num_pending == 0:
            self.ready = True

    def on_message(self, message: Delivery) -> None:
        entry = kv_model.entry_from_delivery(self.bucket, message, delta=0)
        old = self.entries.get(entry.key)
        self.size += len(message.data) - (len(old.value or b"") if old is not None else 0)
        self.entries[entry.key] = entry
        ttl_ns = self._ttl_ns(message)
        if ttl_ns:
            self.expires[entry.key] = message.timestamp_ns + ttl_ns
        else:
            self.expires.pop(entry.key, None)
        floor = self._floors.get(entry.key)
        if floor is not None and entry.revision >= floor:
            del self._floors[entry.key]
        if self.size > self.max_bytes and not self.too_big:
            self.too_big = True
            log.warning(
                "bucket %r holds more than %d bytes: its reads are no longer cached",
                self.bucket, self.max_bytes,
            )  # fmt: skip
        if message.pending == 0:
            self.ready = True

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
