"""Dependencies for the routers, as ``Annotated`` aliases (override them in tests).

All of them are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread,
which for a one-line accessor costs far more than the request's own work."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Path, Request

from app import validation
from app.auth.access import authorize
from app.auth.policy import Principal
from app.config import Settings
from app.consumers.service import ConsumerService
from app.corenats.service import CoreNats
from app.counters.service import CounterService
from app.direct.service import DirectService
from app.kv.service import KVService
from app.lifespan import Runtime
from app.nats.direct import DirectGet
from app.nats.pool import NatsPool
from app.obj.service import ObjService
from app.publish.service import Publisher
from app.push.service import PushService
from app.sse import SseSlots
from app.streams.service import StreamService


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


async def get_pool(runtime: RuntimeDep) -> NatsPool:
    return runtime.pool


async def get_direct(runtime: RuntimeDep) -> DirectGet:
    return runtime.direct


async def get_direct_service(runtime: RuntimeDep) -> DirectService:
    return runtime.direct_service


async def get_streams(runtime: RuntimeDep) -> StreamService:
    return runtime.streams


async def get_publisher(runtime: RuntimeDep) -> Publisher:
    return runtime.publisher


async def get_kv(runtime: RuntimeDep) -> KVService:
    return runtime.kv


async def get_consumers(runtime: RuntimeDep) -> ConsumerService:
    return runtime.consumers


async def get_counters(runtime: RuntimeDep) -> CounterService:
    return runtime.counters


async def get_push(runtime: RuntimeDep) -> PushService:
    return runtime.push


async def get_obj(runtime: RuntimeDep) -> ObjService:
    return runtime.obj


async def get_core(runtime: RuntimeDep) -> CoreNats:
    return runtime.core


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_sse_slots(runtime: RuntimeDep) -> SseSlots:
    return runtime.sse_slots


# What each provider above hands out: the runtime (None) or one of its attributes. The lean
# paths (app.fastpath) take it from there instead of solving the dependency;
# tests/unit/test_lean_arguments.py checks that every entry says what its provider returns.
FROM_RUNTIME: dict[Callable[..., Awaitable[Any]], str | None] = {
    get_runtime: None,
    get_settings: "settings",
    get_pool: "pool",
    get_direct: "direct",
    get_direct_service: "direct_service",
    get_streams: "streams",
    get_publisher: "publisher",
    get_kv: "kv",
    get_consumers: "consumers",
    get_counters: "counters",
    get_push: "push",
    get_obj: "obj",
    get_core: "core",
    get_sse_slots: "sse_slots",
}


SseSlotsDep = Annotated[SseSlots, Depends(get_sse_slots)]
PrincipalDep = Annotated[Principal, Depends(authorize)]
PoolDep = Annotated[NatsPool, Depends(get_pool)]
StreamsDep = Annotated[StreamService, Depends(get_streams)]
DirectDep = Annotated[DirectGet, Depends(get_direct)]
DirectServiceDep = Annotated[DirectService, Depends(get_direct_service)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
KVDep = Annotated[KVService, Depends(get_kv)]
ConsumersDep = Annotated[ConsumerService, Depends(get_consumers)]
CountersDep = Annotated[CounterService, Depends(get_counters)]
PushDep = Annotated[PushService, Depends(get_push)]
ObjDep = Annotated[ObjService, Depends(get_obj)]
CoreDep = Annotated[CoreNats, Depends(get_core)]


async def _stream_name(
    stream: Annotated[
        str, Path(description="Stream name", json_schema_extra=validation.SCHEMAS["stream"])
    ],
) -> str:
    return validation.stream_name(stream)


StreamName = Annotated[str, Depends(_stream_name)]


async def _consumer_name(
    consumer: Annotated[
        str, Path(description="Consumer name", json_schema_extra=validation.SCHEMAS["consumer"])
    ],
) -> str:
    return validation.consumer_name(consumer)


ConsumerName = Annotated[str, Depends(_consumer_name)]


async def _subscription_name(
    name: Annotated[
        str,
        Path(description="Subscription name", json_schema_extra=validation.SCHEMAS["consumer"]),
    ],
) -> str:
    return validation.subscription_name(name)


SubscriptionName = Annotated[str, Depends(_subscription_name)]
