"""The lifespan owns every long-lived resource: embedded server, NATS pool, services."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict

from fastapi import FastAPI

from app import compat
from app.accesslog import AccessLog
from app.auth.guard import Authenticator
from app.clients import ClientAddresses, parse_networks
from app.config import Settings
from app.consumers.service import ConsumerService
from app.corenats.service import CoreNats
from app.counters.service import CounterService
from app.direct.service import DirectService
from app.kv.service import KVService
from app.metrics import Metrics
from app.nats import features
from app.nats.direct import DirectGet
from app.nats.embedded import EmbeddedServer
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.obj.service import ObjService
from app.publish.service import Publisher
from app.push.service import PushService
from app.sse import SseSlots
from app.streams.service import StreamService

log = logging.getLogger("jsgw.lifespan")


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    metrics: Metrics
    pool: NatsPool
    js: JetStreamApi
    direct: DirectGet
    direct_service: DirectService
    streams: StreamService
    kv: KVService
    publisher: Publisher
    consumers: ConsumerService
    counters: CounterService
    push: PushService
    obj: ObjService
    core: CoreNats
    ack_secret: bytes
    auth: Authenticator
    sse_slots: SseSlots
    embedded: EmbeddedServer | None


class State(TypedDict):
    runtime: Runtime


def make_lifespan(
    settings: Settings, metrics: Metrics, access_log: AccessLog | None = None
) -> Callable[[FastAPI], AbstractAsyncContextManager[State]]:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[State]:
        if access_log is not None:
            # Buffered while the lifespan runs; its end writes what is left (below).
            access_log.start()
        embedded: EmbeddedServer | None = None
        pool: NatsPool | None = None
        kv: KVService | None = None
        push: PushService | None = None
        core: CoreNats | None = None
        compat.check()  # (cached: an upgrade is checked once per process, not per app)
        try:
            servers = settings.nats_url
            if settings.embedded:
                embedded = EmbeddedServer(settings.data_dir)
                # Started from this (the main) thread on purpose: the child is tied to the
                # thread that starts it (PR_SET_PDEATHSIG), and a worker thread may end first.
                servers = [embedded.start()]
                log.info("no JSGW_NATS_URL: started an embedded nats-server at %s", servers[0])
            pool = NatsPool(settings, servers, metrics)
            await pool.start(wait=settings.request_timeout)
            if not pool.connected:
                log.warning("no NATS connection yet; the gateway is not ready and keeps trying")
            else:
                _log_server_release(pool.server_info().get("version"))
            ack_secret = _ack_secret(settings)
            auth = Authenticator(
                settings.auth_file, ack_secret, rate=settings.rate_limit, burst=settings.rate_burst
            )
            _reload_on_sighup(auth)
            js = JetStreamApi(pool, settings.js_domain)
            direct = DirectGet(js)
            publisher = Publisher(pool, js, metrics)
            kv = KVService(js, direct, publisher, settings, metrics)
            direct_service = DirectService(direct, js)
            streams = StreamService(js, direct)
            consumers = ConsumerService(pool, js, settings, ack_secret, metrics)
            push = PushService(settings, pool, js, kv, consumers, publisher, metrics)
            await push.start()
            core = CoreNats(pool, settings, metrics)
            runtime = Runtime(
                settings=settings,
                metrics=metrics,
                pool=pool,
                js=js,
                direct=direct,
                direct_service=direct_service,
                streams=streams,
                kv=kv,
                publisher=publisher,
                consumers=consumers,
                counters=CounterService(js, direct, direct_service, streams, publisher),
                push=push,
                obj=ObjService(js, direct),
                core=core,
                ack_secret=ack_secret,
                auth=auth,
                sse_slots=SseSlots(
                    settings.sse_max_per_token,
                    settings.sse_max_streams,
                    settings.retry_after,
                    per_address=settings.sse_max_per_address,
                    clients=ClientAddresses(
                        parse_networks(settings.trusted_proxies), settings.proxy_header
                    ),
                    metrics=metrics,
                ),
                embedded=embedded,
            )
            yield {"runtime": runtime}
        finally:
            # Reverse order of creation: drain NATS, then stop the server it talks to.
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            if push is not None:
                # Deliveries first: POSTs under way finish (within the grace) and are acked
                # while NATS is still there.
                await push.close()
            if core is not None:
                core.close()  # (core subscribe streams get their farewell)
            if kv is not None:
                # Watches first: their consumers are deleted while NATS is still there.
                await kv.close()
            if pool is not None:
                await pool.close()
            if embedded is not None:
                await asyncio.to_thread(embedded.stop)
            if access_log is not None:
                # Last: the requests answered while the rest closed are in it. (Blocks until
                # the lines are written: nothing else runs now.)
                access_log.close()

    return lifespan


def _log_server_release(version: str | None) -> None:
    lacking = features.missing(version)
    if lacking:
        log.warning(
            "nats-server %s does not offer: %s (those requests are answered 501)",
            version,
            "; ".join(f"{item['feature']}, {item['needs']}" for item in lacking),
        )
    else:
        log.info("nats-server %s", version)


def _reload_on_sighup(auth: Authenticator) -> None:
    if auth.path is None:
        return
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, auth.reload)
    except (ValueError, RuntimeError, NotImplementedError):
        # Not the main thread (embedded in tests) or no signals here: changes are still
        # picked up from the file's modification time.
        log.debug("SIGHUP reload not available in this thread")


def _ack_secret(settings: Settings) -> bytes:
    if settings.ack_secret is not None:
        return settings.ack_secret.get_secret_value().encode()
    log.warning(
        "JSGW_ACK_SECRET is not set: using a random one, so ack tokens do not survive a restart "
        "and are not accepted by other gateway replicas"
    )
    return secrets.token_bytes(32)
