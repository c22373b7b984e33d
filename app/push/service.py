"""Push subscriptions: the API's operations, the consumers they deliver from, the registry.

A subscription delivers a durable pull consumer's messages; the consumer is made from the
subscription's ``consumer_config`` when it is missing (and kept when the subscription goes,
unless asked). It must be one the gateway can settle messages of: a pull consumer with
explicit acks; an ordered subscription's has a ``pinned_client`` priority group and
``max_ack_pending`` 1 (one message out at a time: stream order, even across a fail-over),
which the gateway sets on a consumer it makes, and checks on one that exists (409
``subscription.consumer_mismatch``).

Pause and resume are the consumer's own (``$JS.API.CONSUMER.PAUSE``, nats-server 2.11+): every
process and replica stops pulling together, keeps no state of it, and the messages already
out are finished and acked as usual.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from app import errors
from app.config import Settings
from app.consumers.schemas import ConsumerConfig
from app.consumers.service import ConsumerService
from app.durations import MAX_TIME
from app.errors import ErrorCode
from app.kv.model import Precondition
from app.kv.schemas import KVConfig
from app.kv.service import KVService
from app.metrics import Metrics
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.publish.service import Publisher
from app.push import declared as declared_file
from app.push.allowlist import Allowlist
from app.push.registry import Entry, Registry
from app.push.runner import FIXED_HEADERS, MAX_ANSWER, Deps, Runner
from app.push.schemas import Subscription
from app.push.transport import Client

log = logging.getLogger("jsgw.push")

APPLIED_WAIT = 3.0
"""Seconds a PUT or DELETE waits for this process to apply its change before answering."""
UNTIL_RESUMED = MAX_TIME

FilterCheck = Callable[[builtins.list[str]], None]
"""Called with the filter subjects of the consumer a subscription delivers (empty: the whole
stream) before anything is stored; raises to refuse (app.auth.access.check_consumer)."""


class PushService:
    def __init__(
        self,
        settings: Settings,
        pool: NatsPool,
        js: JetStreamApi,
        kv: KVService,
        consumers: ConsumerService,
        publisher: Publisher,
        metrics: Metrics,
    ) -> None:
        self.js = js
        self.kv = kv
        self.consumers = consumers
        self.bucket = settings.subscriptions_bucket
        self.allowlist = Allowlist(settings.push_allowed_urls)
        declared = (
            declared_file.load(settings.subscriptions, self.allowlist)
            if settings.subscriptions is not None
            else {}
        )
        # One client for every subscription of the process: redirects are never followed,
        # no proxy is used (the endpoints are the pod's own), each request has its
        # subscription's timeout.
        ca = str(settings.push_ca) if settings.push_ca is not None else None
        self.http = Client(MAX_ANSWER, FIXED_HEADERS, ca_file=ca)
        deps = Deps(pool, js, publisher, self.http, metrics)

        def runner(name: str, config: Subscription, source: str) -> Runner:
            prepare = (lambda: self.ensure_consumer(config)) if source == "file" else None
            return Runner(name, config, deps, prepare=prepare)

        self.registry = Registry(
            js, self.bucket, declared, self.allowlist, runner, settings.push_shutdown_grace
        )

    async def start(self) -> None:
        self.registry.start()

    async def close(self) -> None:
        await self.registry.close()
        await self.http.aclose()

    # -- reading -----------------------------------------------------------------------------

    async def find(self, name: str) -> Subscription | None:
        """The subscription of this name as stored now (or declared), None if there is none
        (one whose stored form is unreadable has none either)."""
        if name in self.registry.declared:
            return self.registry.declared[name]
        try:
            entry = await self.kv.get(self.bucket, name, leader=True)
        except errors.NotFound:
            return None
        try:
            return Subscription.model_validate_json(entry.value or b"")
        except ValueError:
            return None

    async def subscription(self, name: str) -> Subscription:
        """:meth:`find`, or 404 ``subscription.not_found``."""
        config = await self.find(name)
        if config is None:
            raise _not_found(name)
        return config

    async def info(self, name: str) -> dict[str, Any]:
        entry = self.registry.entries.get(name)
        if entry is None:
            # Stored, and not (yet) applied by this process: not delivered here.
            config = await self.subscription(name)
            entry = Entry(name, "api", config, config.out())
        return await self._info(entry)

    async def list(self, visible: Callable[[Subscription], bool] | None = None) -> dict[str, Any]:
        entries = [
            entry
            for entry in sorted(self.registry.entries.values(), key=lambda e: e.name)
            if visible is None or (entry.config is not None and visible(entry.config))
        ]
        return {"subscriptions": await asyncio.gather(*(self._info(e) for e in entries))}

    async def _info(self, entry: Entry) -> dict[str, Any]:
        state: dict[str, Any] = {
            "running": False,
            "in_flight": 0,
            "delivered": 0,
            "acked": 0,
            "retried": 0,
            "terminated": 0,
            "dead_lettered": 0,
            "last_error": None,
        }
        if entry.runner is not None:
            state.update(entry.runner.state())
        state.update(paused=False, num_pending=None, num_ack_pending=None, source=entry.source)
        if entry.refused is not None:
            state["refused"] = entry.refused
        if entry.config is not None:
            with contextlib.suppress(errors.GatewayError):
                info = await self.js.call(
                    "push.consumer_info",
                    "CONSUMER",
                    "INFO",
                    entry.config.stream,
                    entry.config.consumer,
                )
                state.update(
                    paused=bool(info.get("paused")),
                    num_pending=int(info.get("num_pending") or 0),
                    num_ack_pending=int(info.get("num_ack_pending") or 0),
                )
        return {"name": entry.name, "config": entry.stored, "state": state}

    # -- writing -----------------------------------------------------------------------------

    async def put(
        self, name: str, config: Subscription, check_filters: FilterCheck | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Store the subscription (every process starts delivering it); its consumer is made
        when missing. Returns (info, created)."""
        self._not_declared(name)
        self.allowlist.check(config.endpoint)
        await self.ensure_consumer(config, check_filters)
        value = orjson.dumps(config.out())
        revision, created = await self._store(name, value)
        await self.registry.applied(revision, APPLIED_WAIT)
        entry = self.registry.entries.get(name)
        if entry is None:  # not applied here yet (or refused): what was stored
            entry = Entry(name, "api", config, config.out())
        return await self._info(entry), created

    async def _store(self, name: str, value: bytes) -> tuple[int, bool]:
        for attempt in range(2):
            try:
                try:
                    revision, _ = await self.kv.put(
                        self.bucket, name, value, Precondition(create=True)
                    )
                    return revision, True
                except errors.PreconditionFailed:
                    revision, _ = await self.kv.put(self.bucket, name, value, Precondition())
                    return revision, False
            except errors.NotFound:
                if attempt:
                    raise
                await self.kv.buckets.put(
                    self.bucket,
                    KVConfig(history=1, description="jsgw push subscriptions"),
                )
                self.registry.wake()
        raise AssertionError("unreachable")

    async def delete(self, name: str, *, delete_consumer: bool) -> None:
        self._not_declared(name)
        config = await self.find(name)
        if config is None and name not in self.registry.entries:
            raise _not_found(name)
        try:
            revision = await self.kv.delete(
                self.bucket, name, purge=True, precondition=Precondition()
            )
        except errors.NotFound:
            raise _not_found(name) from None
        await self.registry.applied(revision, APPLIED_WAIT)
        if delete_consumer and config is not None:
            with contextlib.suppress(errors.ConsumerNotFound):
                await self.consumers.delete(config.stream, config.consumer)

    async def pause(self, name: str, until: str | int | float | None) -> dict[str, Any]:
        config = await self.subscription(name)
        await self.consumers.pause(
            config.stream, config.consumer, UNTIL_RESUMED if until is None else until
        )
        return await self.info(name)

    async def resume(self, name: str) -> dict[str, Any]:
        config = await self.subscription(name)
        await self.consumers.resume(config.stream, config.consumer)
        return await self.info(name)

    def _not_declared(self, name: str) -> None:
        if name in self.registry.declared:
            raise errors.Conflict(
                ErrorCode.SUBSCRIPTION_DECLARED_IN_FILE,
                f"subscription {name!r} is declared in JSGW_SUBSCRIPTIONS: change it there",
            )

    # -- consumers ---------------------------------------------------------------------------

    async def ensure_consumer(
        self, config: Subscription, check_filters: FilterCheck | None = None
    ) -> None:
        """Make the subscription's consumer when it is missing, and check the one there.

        A ``consumer_config`` given for a consumer that exists is not applied, but still
        checked by the server (a create of a consumer that exists is refused after its config
        is), so that a bad one is a 400 either way."""
        try:
            info: dict[str, Any] | None = await self._consumer_info(config)
        except errors.ConsumerNotFound:
            info = None
        if info is None or config.consumer_config is not None:
            wanted = consumer_to_make(config)
            if check_filters is not None:
                check_filters(_filters(wanted.model_dump(exclude_none=True)))
            with contextlib.suppress(errors.ConsumerExists):
                await self.consumers.create(config.stream, config.consumer, wanted)
            if info is None:
                info = await self._consumer_info(config)
        existing = info.get("config") or {}
        if check_filters is not None:
            check_filters(_filters(existing))
        check_consumer(config, existing)

    async def _consumer_info(self, config: Subscription) -> dict[str, Any]:
        return await self.js.call(
            "push.consumer_info", "CONSUMER", "INFO", config.stream, config.consumer
        )


def consumer_to_make(config: Subscription) -> ConsumerConfig:
    """The consumer an absent one is made from: ``consumer_config`` (or the defaults), with
    what an ordered subscription needs filled in; 400 when it says otherwise."""
    wanted = config.consumer_config or ConsumerConfig()
    if wanted.ack_policy != "explicit":
        raise _invalid("the consumer of a subscription acks explicitly: ack_policy 'explicit'")
    if not config.ordered:
        return wanted
    if wanted.priority_policy not in (None, "pinned_client"):
        raise _invalid("an ordered subscription's consumer has priority_policy 'pinned_client'")
    if wanted.priority_groups is not None and config.group not in wanted.priority_groups:
        raise _invalid(
            f"the consumer's priority_groups lack the subscription's group {config.group!r}"
        )
    if wanted.max_ack_pending not in (None, 1):
        raise _invalid("an ordered subscription's consumer has max_ack_pending 1")
    return wanted.model_copy(
        update={
            "priority_policy": "pinned_client",
            "priority_groups": wanted.priority_groups or [config.group],
            "max_ack_pending": 1,
        }
    )


def check_consumer(config: Subscription, existing: dict[str, Any]) -> None:
    """409 ``subscription.consumer_mismatch`` when the existing consumer cannot serve the
    subscription."""
    name = f"{config.stream}/{config.consumer}"
    if existing.get("deliver_subject"):
        raise _mismatch(f"consumer {name} is a push consumer: a subscription pulls")
    if existing.get("ack_policy", "explicit") != "explicit":
        raise _mismatch(f"consumer {name} does not ack explicitly (ack_policy 'explicit')")
    groups = existing.get("priority_groups") or []
    policy = existing.get("priority_policy") or "none"
    if config.ordered:
        if policy != "pinned_client" or config.group not in groups:
            raise _mismatch(
                f"an ordered subscription needs a pinned_client priority group {config.group!r} "
                f"on consumer {name}"
            )
        if existing.get("max_ack_pending") != 1:
            raise _mismatch(f"an ordered subscription needs max_ack_pending 1 on consumer {name}")
    elif groups and config.group not in groups:
        raise _mismatch(
            f"consumer {name} has priority groups {groups}: give one of them as the "
            "subscription's group"
        )


def _filters(config: dict[str, Any]) -> builtins.list[str]:
    if config.get("filter_subjects"):
        return list(config["filter_subjects"])
    return [config["filter_subject"]] if config.get("filter_subject") else []


def _not_found(name: str) -> errors.NotFound:
    return errors.NotFound(ErrorCode.SUBSCRIPTION_NOT_FOUND, f"no subscription {name!r}")


def _invalid(detail: str) -> errors.InvalidInput:
    return errors.InvalidInput(ErrorCode.SUBSCRIPTION_INVALID, detail)


def _mismatch(detail: str) -> errors.Conflict:
    return errors.Conflict(ErrorCode.SUBSCRIPTION_CONSUMER_MISMATCH, detail)
