"""Durable pull consumers (ADR-37) with priority groups, overflow and pinning (ADR-42)."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import Header, Query, Request
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from app import errors, validation
from app.auth import access
from app.auth.access import CONSUMER, STREAM, Need
from app.auth.policy import Principal
from app.consumers.schemas import (
    CONSUME_RULES,
    AckBatch,
    AckBatchResult,
    ConsumeQuery,
    ConsumerConfig,
    ConsumerInfo,
    ConsumerList,
    DeliveredMessage,
    FetchRequest,
    FetchResult,
    NextRequest,
    PauseRequest,
    PauseState,
    UnpinRequest,
)
from app.consumers.service import ConsumerService, Guard
from app.deps import (
    ConsumerName,
    ConsumersDep,
    PrincipalDep,
    SettingsDep,
    SseSlotsDep,
    StreamName,
)
from app.http import JSON, link, links, problems
from app.nats.pull import PIN_HEADER
from app.routing import Router
from app.schemas import MAX_GO_INT, rules
from app.sse import sse_response

router = Router(prefix="/v1/streams/{stream}/consumers", tags=["consumers"])

PinId = Annotated[
    str | None,
    Header(
        alias=PIN_HEADER,
        description="the pin id of the last answer, for a pinned_client group; omit it when "
        "the last answer had none, and drop it after a 423",
        json_schema_extra=validation.SCHEMAS["pin_id"],
    ),
]
_PIN_RESPONSE_HEADER = {
    PIN_HEADER: {
        "description": "pinned: send this back with the next pull",
        "schema": {"type": "string"},
    }
}
_STREAM, _CONSUMER = "$request.path.stream", "$request.path.consumer"
_LISTED = "$response.body#/consumers/0/name"
_PULL_ERRORS = problems(errors.NotFound, errors.Conflict, errors.Locked, errors.TooManyRequests)


@router.get(
    "",
    access=Need("read", STREAM),
    response_model=ConsumerList,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound),
    openapi_extra=links(
        200,
        info=link("get_consumer", stream=_STREAM, consumer=_LISTED),
        fetch=link("fetch_messages", stream=_STREAM, consumer=_LISTED),
        next=link("next_message", stream=_STREAM, consumer=_LISTED),
    ),
)
async def list_consumers(
    stream: StreamName,
    consumers: ConsumersDep,
    principal: PrincipalDep,
    offset: Annotated[int, Query(ge=0, le=MAX_GO_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 256,
) -> Any:
    """List a stream's consumers with their config and state: with auth on, only those the
    token may consume or administer (whose info it may get), and `total` counts only those."""
    if principal.anonymous:
        return await consumers.list(stream, offset, limit)
    return await consumers.list(
        stream, offset, limit, visible=lambda name: access.sees_consumer(principal, stream, name)
    )


@router.put(
    "/{consumer}",
    access=Need("admin", CONSUMER),
    response_model=ConsumerInfo,
    response_model_exclude_none=True,
    response_class=JSON,
    status_code=200,
    responses={
        201: {"description": "Created", "model": ConsumerInfo},
        **problems(errors.NotFound, errors.Conflict, errors.Unsupported),
    },
    openapi_extra=links(
        200,
        201,
        info=link("get_consumer", stream=_STREAM, consumer=_CONSUMER),
        fetch=link("fetch_messages", stream=_STREAM, consumer=_CONSUMER),
        next=link("next_message", stream=_STREAM, consumer=_CONSUMER),
        delete=link("delete_consumer", stream=_STREAM, consumer=_CONSUMER),
    ),
)
async def put_consumer(
    stream: StreamName, name: ConsumerName, config: ConsumerConfig, consumers: ConsumersDep
) -> Any:
    """Create (201) or update (200) a durable pull consumer from a ConsumerConfig."""
    info, created = await consumers.put(stream, name, config)
    return JSON(info, status_code=201 if created else 200)


@router.get(
    "/{consumer}",
    access=Need("consume", CONSUMER),
    response_model=ConsumerInfo,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def get_consumer(stream: StreamName, name: ConsumerName, consumers: ConsumersDep) -> Any:
    """Consumer info: config (durations in seconds), state and priority group pins."""
    return await consumers.info(stream, name)


@router.delete(
    "/{consumer}",
    access=Need("admin", CONSUMER),
    status_code=204,
    responses=problems(errors.NotFound),
)
async def delete_consumer(
    stream: StreamName, name: ConsumerName, consumers: ConsumersDep
) -> Response:
    """Delete a consumer."""
    await consumers.delete(stream, name)
    return Response(status_code=204)


@router.post(
    "/{consumer}/fetch",
    access=Need("consume", CONSUMER),
    response_model=FetchResult,
    response_model_exclude_none=True,
    response_class=JSON,
    responses={200: {"headers": _PIN_RESPONSE_HEADER}, **_PULL_ERRORS},
    openapi_extra=links(
        200,
        ack=link(
            "ack_messages",
            {"acks": [{"token": "$response.body#/messages/0/ack_token"}]},
            stream=_STREAM,
            consumer=_CONSUMER,
        ),
    ),
)
async def fetch_messages(
    stream: StreamName,
    name: ConsumerName,
    consumers: ConsumersDep,
    principal: PrincipalDep,
    pin_id: PinId = None,
    request: FetchRequest | None = None,
) -> Any:
    """Pull up to max_messages (or max_bytes) messages; 200 with what arrived before expires.

    Ack each message with its ack_token. With a pinned_client group, send back the pin_id
    of the last answer in the Nats-Pin-Id header; 423 means another client holds the pin.
    """
    guard = await _may_consume(principal, consumers, stream, name)
    fetched = await consumers.fetch(stream, name, request or FetchRequest(), pin_id, guard)
    body: dict[str, Any] = {"messages": fetched.messages}
    if fetched.pin_id:
        body["pin_id"] = fetched.pin_id
    return JSON(body, headers=_pin_headers(fetched.pin_id))


@router.post(
    "/{consumer}/next",
    access=Need("consume", CONSUMER),
    response_model=DeliveredMessage,
    response_class=JSON,
    responses={
        200: {"headers": _PIN_RESPONSE_HEADER},
        204: {"description": "No message arrived before expires"},
        **_PULL_ERRORS,
    },
)
async def next_message(
    stream: StreamName,
    name: ConsumerName,
    consumers: ConsumersDep,
    principal: PrincipalDep,
    pin_id: PinId = None,
    request: NextRequest | None = None,
) -> Any:
    """Pull one message: 200 with it, or 204 when none arrived before expires."""
    guard = await _may_consume(principal, consumers, stream, name)
    fetched = await consumers.fetch(stream, name, request or NextRequest(), pin_id, guard)
    headers = _pin_headers(fetched.pin_id)
    if not fetched.messages:
        return Response(status_code=204, headers=headers)
    return JSON(fetched.messages[0], headers=headers)


@router.get(
    "/{consumer}/consume",
    access=Need("consume", CONSUMER, sse=True),
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "SSE: `message` (id = stream sequence, data = delivered message "
            "JSON), `pinned`, `unpinned`, `warning`, and `error` before the gateway closes",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **_PULL_ERRORS,
    },
    openapi_extra=rules(*CONSUME_RULES),
)
async def consume_messages(
    stream: StreamName,
    name: ConsumerName,
    query: Annotated[ConsumeQuery, Query()],
    consumers: ConsumersDep,
    settings: SettingsDep,
    slots: SseSlotsDep,
    principal: PrincipalDep,
    http: Request,
    pin_id: PinId = None,
) -> EventSourceResponse:
    """Consume continuously over Server-Sent Events (ADR-37), acking with the ack_tokens.

    Closing the connection stops pulling at once; messages delivered to the gateway but not
    to you are not acked and come back after the consumer's ack_wait.
    """
    guard = await _may_consume(principal, consumers, stream, name)
    release = slots.acquire(principal, http.scope, "consume")
    try:
        events = await consumers.consume(stream, name, query, pin_id, guard)
    except BaseException:
        await release()
        raise
    return sse_response(events, release=release, heartbeat=settings.sse_heartbeat)


@router.post(
    "/{consumer}/ack",
    access=Need("consume", CONSUMER),
    response_model=AckBatchResult,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.Forbidden, errors.PayloadTooLarge),
)
async def ack_messages(
    stream: StreamName,
    name: ConsumerName,
    batch: AckBatch,
    consumers: ConsumersDep,
    principal: PrincipalDep,
) -> Any:
    """Ack, nak (with an optional delay), wpi or term (with a reason) delivered messages.

    Every token is checked first: a forged or foreign token rejects the whole request and
    nothing is sent. Each ack counts once the server confirmed it; one result per ack.
    """
    with contextlib.suppress(errors.NotFound):  # then each ack answers that it is gone
        await _may_consume(principal, consumers, stream, name)
    # The results are what response_model would serialize (tests/unit/test_ack_results.py):
    # sent as they are, not validated into up to a thousand models and dumped again.
    return JSON({"results": await consumers.ack(stream, name, batch.acks)})


@router.post(
    "/{consumer}/unpin",
    access=Need("consume", CONSUMER),
    status_code=204,
    responses=problems(errors.NotFound, errors.Conflict, errors.Unsupported),
)
async def unpin_group(
    stream: StreamName, name: ConsumerName, request: UnpinRequest, consumers: ConsumersDep
) -> Response:
    """Unpin a pinned_client group: the server pins the next client that pulls."""
    await consumers.unpin(stream, name, request.group)
    return Response(status_code=204)


@router.post(
    "/{consumer}/pause",
    access=Need("admin", CONSUMER),
    response_model=PauseState,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Unsupported),
)
async def pause_consumer(
    stream: StreamName, name: ConsumerName, request: PauseRequest, consumers: ConsumersDep
) -> Any:
    """Pause a consumer until a time (RFC 3339) or for a duration: it delivers nothing
    meanwhile (pulls wait), then resumes by itself. 400 for a time not in the future."""
    return await consumers.pause(stream, name, request.until)


@router.post(
    "/{consumer}/resume",
    access=Need("admin", CONSUMER),
    response_model=PauseState,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Unsupported),
)
async def resume_consumer(stream: StreamName, name: ConsumerName, consumers: ConsumersDep) -> Any:
    """End a consumer's pause now: it delivers again."""
    return await consumers.resume(stream, name)


async def _may_consume(
    principal: Principal, consumers: ConsumerService, stream: str, name: str
) -> Guard | None:
    """403 when the consumer's filter reaches subjects a deny of the token's stream rules
    takes from it; else the guard that checks each delivered message against the same rules
    (the consumer may be re-created with another filter at any time)."""
    if principal.anonymous or not access.concerns_stream(principal, stream):
        return None
    access.check_consumer(principal, stream, name, await consumers.filters(stream, name))

    def guard(subject: str) -> None:
        access.check_delivered(principal, stream, name, subject)

    return guard


def _pin_headers(pin_id: str | None) -> dict[str, str]:
    return {PIN_HEADER: pin_id} if pin_id else {}
