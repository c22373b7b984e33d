"""Core NATS over HTTP: publish, request/reply and subscribe, outside JetStream."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query, Request
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from app import errors, validation
from app.auth import access
from app.auth.access import SUBJECT, SUBJECT_FILTER, Need
from app.auth.policy import Principal, Resource
from app.corenats import subjects
from app.corenats.service import DEFAULT_MAX_TIMEOUT, MIN_TIMEOUT
from app.deps import CoreDep, PrincipalDep, SettingsDep, SseSlotsDep, StreamsDep
from app.http import problems, read_body
from app.nats.replies import Reply
from app.publish.service import USER_HEADER_PREFIX, http_user_headers
from app.routing import Router
from app.schemas import Duration, duration, rules
from app.sse import sse_response
from app.streams.service import StreamService

router = Router(prefix="/v1/nats", tags=["nats"])

_RAW_BODY = {
    "requestBody": {
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    }
}
Subject = Annotated[
    str,
    Path(
        description="A literal subject, outside the reserved namespaces ($..., _INBOX, _R_, "
        "_GR_: 400 nats.subject_reserved)",
        json_schema_extra=subjects.SUBJECT_SCHEMA,
    ),
]


@router.post(
    "/publish/{subject:text}",
    access=Need("write", SUBJECT),
    lean=True,
    status_code=202,
    response_class=Response,
    responses={
        202: {"description": "Handed to a NATS connection: no one confirms delivery"},
        **problems(errors.Forbidden, errors.PayloadTooLarge),
    },
    openapi_extra=_RAW_BODY,
)
async def core_publish(
    subject: Subject,
    request: Request,
    core: CoreDep,
    principal: PrincipalDep,
    streams: StreamsDep,
) -> Response:
    """Publish the raw body with core NATS (no JetStream acknowledgement).

    202 means the gateway handed the message to a NATS connection, nothing more: core NATS
    confirms nothing, so a subscriber that was not there, or a connection lost right after,
    loses it unseen. A stream that captures the subject stores it, but the client is not told
    (use `POST /v1/publish/{subject}` for a PubAck). Headers `Nats-Header-<Name>: value` go out
    as NATS header `<Name>`.
    """
    subjects.literal(subject)
    await _streams_allow(principal, streams, subject, "write")
    headers = http_user_headers(request.headers.items())
    data = await read_body(request, core.max_payload)
    await core.publish(subject, data, headers)
    return Response(status_code=202)


@router.post(
    "/request/{subject:text}",
    access=Need("write", SUBJECT),
    lean=True,
    response_class=Response,
    responses={
        200: {
            "description": "The reply's payload as the body, its headers as "
            "`Nats-Header-<Name>` response headers",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        },
        **problems(errors.Forbidden, errors.PayloadTooLarge),
    },
    openapi_extra={
        **_RAW_BODY,
        **rules(duration("timeout", minimum=MIN_TIMEOUT, maximum=DEFAULT_MAX_TIMEOUT)),
    },
)
async def core_request(
    subject: Subject,
    request: Request,
    core: CoreDep,
    principal: PrincipalDep,
    streams: StreamsDep,
    timeout: Annotated[
        Duration | None,
        Query(
            description="how long to wait for the reply: seconds or '500ms'; default "
            "JSGW_REQUEST_TIMEOUT, at most JSGW_NATS_REQUEST_MAX_TIMEOUT (400 above it)"
        ),
    ] = None,
) -> Response:
    """Send the raw body as a core NATS request and answer with the first reply.

    The reply's payload is the body and its headers come back as `Nats-Header-<Name>`
    response headers. 503 `nats.no_responders` when nobody subscribes to the subject (the
    server's no-responders status), 504 `nats.timeout` when nobody answered in time (the
    request may still have been acted on). Headers `Nats-Header-<Name>: value` go out as
    NATS header `<Name>`.
    """
    subjects.literal(subject)
    wait = core.timeout(timeout)
    await _streams_allow(principal, streams, subject, "write")
    headers = http_user_headers(request.headers.items())
    data = await read_body(request, core.max_payload)
    return reply_response(await core.request(subject, data, headers, wait))


async def _streams_allow(
    principal: Principal, streams: StreamService, subject: str, action: str
) -> None:
    """What core NATS publishes on a subject a stream captures is stored there, and what it
    delivers from such a subject is that stream's traffic: where the token has stream rules
    for such a stream, they decide as on the stream routes (403 otherwise), so that a
    `subject:` grant does not go around a stream rule that denies. A stream none of the
    token's stream rules names is left to its `subject:` rules, as NATS's own permissions
    leave it."""
    # (No stream rule, nothing to look up: the streams a core subject can reach are plain
    # ones, the reserved $KV and $O subjects of buckets being refused already.)
    if principal.anonymous or not any(r.pattern.kind == "stream" for r in principal.rules):
        return
    if action == "write":
        found = await streams.capturing(subject)
        meeting = [found] if found else []
    else:
        meeting = await streams.meeting(subject)
    for stream in meeting:
        if not access.concerns_stream(principal, stream):
            continue
        if action == "write":
            access.require(principal, "write", Resource("stream", stream, subject))
        else:
            access.check_read_filter(principal, stream, subject)


def reply_response(reply: Reply) -> Response:
    response = Response(reply.data, media_type="application/octet-stream")
    for name, values in reply.headers.values.items():
        for value in values:
            # What HTTP cannot carry as it is (non-ASCII, control characters) is left out.
            if _http_safe(name) and _http_safe(value):
                response.headers.append(f"{USER_HEADER_PREFIX.title()}{name}", value)
    return response


def _http_safe(text: str) -> bool:
    return text.isascii() and text.isprintable() and len(text) <= validation.MAX_HEADER_VALUE_LENGTH


@router.get(
    "/subscribe/{subject:text}",
    access=Need("read", SUBJECT_FILTER, narrowed=True, sse=True),
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "SSE: `message` (data = Message JSON without stream and seq: "
            "`{subject, time, headers, data}`), `error` before the gateway ends the stream "
            "(`nats.slow_consumer`, `gateway.shutdown`, `nats.unavailable`); `: ping` comments",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problems(errors.Forbidden, errors.TooManyRequests),
    },
)
async def core_subscribe(
    subject: Annotated[
        str,
        Path(
            description="A subject or a filter with `*` and `>` (not as the first token), "
            "outside the reserved namespaces",
            json_schema_extra=subjects.FILTER_SCHEMA,
        ),
    ],
    request: Request,
    core: CoreDep,
    principal: PrincipalDep,
    streams: StreamsDep,
    slots: SseSlotsDep,
    settings: SettingsDep,
    queue: Annotated[
        str | None,
        Query(
            description="join this queue group: each message goes to one of its members "
            "(HTTP clients and NATS clients alike)",
            json_schema_extra=subjects.QUEUE_SCHEMA,
        ),
    ] = None,
) -> Any:
    """Stream the messages published on a subject or filter, as server-sent events.

    Core NATS keeps nothing: the stream has what is published while it is open. A client
    that falls `JSGW_SSE_QUEUE_SIZE` messages (or `JSGW_NATS_SUBSCRIBE_QUEUE_BYTES`) behind
    gets `error` `nats.slow_consumer` and the end of the stream. A token that may read only
    part of the filter gets only that part; in a queue group it must read all of it (403).
    """
    subjects.subscription(subject)
    if queue is not None:
        subjects.queue(queue)
    visible = access.subject_reader(principal, subject, whole=queue is not None)
    await _streams_allow(principal, streams, subject, "read")
    release = slots.acquire(principal, request.scope, "core_subscribe")
    try:
        opened = await core.subscribe(subject, queue, visible)
    except BaseException:
        await release()
        raise

    async def finish() -> None:
        try:
            await opened.close()
        finally:
            await release()

    return sse_response(opened.events(), release=finish, heartbeat=settings.sse_heartbeat)
