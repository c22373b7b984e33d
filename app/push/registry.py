"""Which subscriptions a gateway process delivers, and their runners.

Two sources. The file's (``JSGW_SUBSCRIPTIONS``), read at start-up, are this process's own.
Those made through the API are stored as JSON in a KV bucket (``JSGW_SUBSCRIPTIONS_BUCKET``,
history 1, key = subscription name), and every process watches it: an ordered consumer with
``last_per_subject`` (app.nats.ordered: it outlives reconnects and server restarts) hands over
each stored subscription, then every change, in the bucket's order. So a PUT through one
worker or replica starts a runner in every one, a DELETE stops them all, and subscriptions
survive restarts. The changes are applied one at a time, in that order, by one task.

What is read from the bucket is checked again as a request would be, the endpoint against
this process's ``JSGW_PUSH_ALLOWED_URLS`` included: whoever can write the bucket directly
must not be able to point the gateway at a service the API would refuse. Such an entry is
shown, with why it is refused, and not delivered. A bucket entry with the name of a
subscription of the file is ignored (the file's wins).

While the bucket does not exist the process waits for it: the server's advisory of a created
stream wakes it, and it looks again every :data:`BUCKET_POLL` seconds (advisories do not
cross JetStream domains). A deleted bucket stops its subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from pydantic import ValidationError

from app import errors, validation
from app.kv import model as kv_model
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.pull import unsubscribe
from app.nats.scan import Delivery
from app.push.allowlist import Allowlist
from app.push.runner import Runner
from app.push.schemas import Subscription
from app.tasks import cancel_and_wait

log = logging.getLogger("jsgw.push.registry")

BUCKET_POLL = 5.0
_HEARTBEAT = 5.0
_RETRY = 2.0


@dataclass(slots=True)
class Entry:
    name: str
    source: str  # "api" | "file"
    config: Subscription | None
    stored: dict[str, Any]
    """The subscription as stored (or declared): what answers show."""
    runner: Runner | None = None
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class _Change:
    name: str
    operation: str
    value: bytes
    revision: int


class Registry:
    def __init__(
        self,
        js: JetStreamApi,
        bucket: str,
        declared: dict[str, Subscription],
        allowlist: Allowlist,
        runner: Callable[[str, Subscription, str], Runner],
        grace: float,
    ) -> None:
        self.js = js
        self.bucket = bucket
        self.declared = declared
        self.allowlist = allowlist
        self._runner = runner
        self._grace = grace
        self.entries: dict[str, Entry] = {}
        self.position = 0
        """Every change of the bucket up to this revision is applied."""
        self._changes: asyncio.Queue[_Change] = asyncio.Queue()
        self._failed = asyncio.Event()
        self._wake = asyncio.Event()
        self._advanced = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[asyncio.Task[None]] = set()
        self._advisory: NatsSubscription | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for name, config in self.declared.items():
            runner = self._runner(name, config, "file")
            runner.start()
            self.entries[name] = Entry(name, "file", config, config.out(), runner)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._watch(), name="push-registry-watch"),
            loop.create_task(self._apply_changes(), name="push-registry-apply"),
        ]

    async def close(self) -> None:
        """Stop watching, then every runner (each within the grace, all at once). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:  # both at once: no change is applied while the watch ends
            task.cancel()
        for task in self._tasks:
            await cancel_and_wait(task)
        if self._advisory is not None:
            await unsubscribe(self._advisory)
        runners = [entry.runner for entry in self.entries.values() if entry.runner is not None]
        self.entries.clear()
        await asyncio.gather(*(runner.stop(self._grace) for runner in runners))
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def wake(self) -> None:
        """The bucket may exist now (this process just created it)."""
        self._wake.set()

    async def applied(self, revision: int, timeout: float) -> bool:
        """Wait until the change at ``revision`` is applied here (at most ``timeout`` s)."""
        async with self._advanced:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._advanced.wait_for(lambda: self.position >= revision), timeout
                )
            return self.position >= revision

    # -- the bucket ------------------------------------------------------------------------

    async def _watch(self) -> None:
        config = OrderedConfig(
            stream=kv_model.stream_name(self.bucket),
            filter_subject=kv_model.filter_subject(self.bucket, ">"),
            deliver_policy="last_per_subject",
            idle_heartbeat=_HEARTBEAT,
        )
        while True:
            consumer = OrderedConsumer(self.js, config, self)
            try:
                info = await self.js.call("push.registry", "STREAM", "INFO", config.stream)
                self._failed.clear()
                await consumer.start(info)
            except errors.NotFound:
                await self._wait_for_bucket(config.stream)
                continue
            except errors.GatewayError as exc:
                log.debug("subscriptions bucket not watched yet: %s", exc.detail)
                await asyncio.sleep(_RETRY)
                continue
            try:
                await self._failed.wait()
            finally:
                with contextlib.suppress(errors.GatewayError):
                    await consumer.close()
            # The bucket is gone (or the watch refused): its subscriptions go with it.
            await self._changes.put(_Change("", "RESET", b"", 0))

    async def _wait_for_bucket(self, stream: str) -> None:
        if self._advisory is None:
            with contextlib.suppress(errors.GatewayError, nats.errors.Error):
                client = self.js.pool.pick()

                async def created(_: Msg) -> None:
                    self._wake.set()

                self._advisory = await client.subscribe(
                    f"$JS.EVENT.ADVISORY.STREAM.CREATED.{stream}", cb=created
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), BUCKET_POLL)
        self._wake.clear()

    # The ordered consumer's listener (called from its delivery path: must not block).

    def on_start(self, num_pending: int, position: int) -> None:
        pass

    def on_message(self, message: Delivery) -> None:
        try:
            entry = kv_model.entry_from_delivery(self.bucket, message, delta=0)
        except errors.GatewayError:
            return
        self._changes.put_nowait(
            _Change(entry.key, entry.operation, entry.value or b"", entry.revision)
        )

    def on_error(self, error: errors.GatewayError) -> None:
        log.info("subscriptions bucket watch ended: %s", error.detail)
        self._failed.set()

    # -- applying changes ------------------------------------------------------------------

    async def _apply_changes(self) -> None:
        while True:
            change = await self._changes.get()
            if change.operation == "RESET":
                for name in [n for n, e in self.entries.items() if e.source == "api"]:
                    self._drop(name)
                self.position = 0  # a bucket made again counts its revisions from 1
                continue
            try:
                self._apply(change)
            except Exception:  # a bug here must not end every later change
                log.exception("subscription %r: change not applied", change.name)
            async with self._advanced:
                self.position = max(self.position, change.revision)
                self._advanced.notify_all()

    def _apply(self, change: _Change) -> None:
        name = change.name
        if name in self.declared:
            log.warning(
                "subscription %r in bucket %r is ignored: JSGW_SUBSCRIPTIONS declares it",
                name,
                self.bucket,
            )
            return
        if not validation.is_name_token(name) or len(name) > 255:
            return
        if change.operation != kv_model.PUT:
            self._drop(name)
            return
        stored, config, refused = self._read(change.value)
        current = self.entries.get(name)
        if refused is not None:
            log.error("subscription %r is not delivered: %s", name, refused)
            self._drop(name)
            self.entries[name] = Entry(name, "api", config, stored, refused=refused)
            return
        assert config is not None
        if current is not None and current.config == config and current.runner is not None:
            current.stored = stored
            return
        self._drop(name)
        runner = self._runner(name, config, "api")
        runner.start()
        self.entries[name] = Entry(name, "api", config, stored, runner)
        log.info(
            "subscription %r: delivering %s/%s to %s",
            name,
            config.stream,
            config.consumer,
            config.endpoint,
        )

    def _read(self, value: bytes) -> tuple[dict[str, Any], Subscription | None, str | None]:
        """The stored JSON, the subscription, and why it is refused (None: it is not)."""
        try:
            stored = orjson.loads(value)
        except orjson.JSONDecodeError:
            return {}, None, "the stored value is not JSON"
        if not isinstance(stored, dict):
            return {}, None, "the stored value is not a JSON object"
        try:
            config = Subscription.model_validate(stored)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "body"
            return stored, None, f"the stored subscription is not valid: {where}: {first['msg']}"
        try:
            self.allowlist.check(config.endpoint)
        except errors.InvalidInput as exc:
            return stored, config, exc.detail
        return stored, config, None

    def _drop(self, name: str) -> None:
        entry = self.entries.pop(name, None)
        if entry is None or entry.runner is None:
            return
        task = asyncio.get_running_loop().create_task(entry.runner.stop(self._grace))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        log.info("subscription %r: stopped", name)
