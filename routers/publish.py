"""Publishing to streams, one message (raw body) or a batch (JSON)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query, Request
from starlette.responses import Response

from app import errors, validation
from app.auth import access
from app.auth.access import Need
from app.auth.policy import Principal, Resource
from app.deps import PoolDep, PrincipalDep, PublisherDep, SettingsDep, StreamsDep
from app.errors import ErrorCode
from app.http import JSON, JSONBytes, link, links, problems, read_body
from app.nats import features
from app.publish import atomic as publish_atomic
from app.publish import schedules
from app.publish import service as publish
from app.publish.schemas import AtomicPubAck, PubAck, PublishBatch, PublishBatchResult
from app.publish.service import Outgoing
from app.routing import Router
from app.schemas import exclusive, rules
from app.streams.service import StreamService

router = Router(prefix="/v1/publish", tags=["publish"])

_PUBLISH_ERRORS = problems(
    errors.Forbidden,
    errors.NotFound,
    errors.Conflict,
    errors.PreconditionFailed,
    errors.PayloadTooLarge,
    errors.Unsupported,
)

# (up to 19 digits, as the gateway takes sequences: app.validation.REVISION_DIGITS)
_SEQUENCE = {"type": "integer", "minimum": 0, "maximum": 10**validation.REVISION_DIGITS - 1}
_MSG_ID = {"type": "string", "minLength": 1}
# What each allowlisted header does (app.publish.service.PUBLISH_HEADERS, HTTP_ALIASES).
_HEADER_DOCS: dict[str, tuple[dict[str, Any], str]] = {
    "nats-msg-id": (
        _MSG_ID,
        "deduplication id: a repeat within the duplicate window is not stored",
    ),
    "idempotency-key": (_MSG_ID, "the same as Nats-Msg-Id"),
    "nats-expected-stream": (
        {"type": "string", **validation.SCHEMAS["stream"]},
        "store only in this stream (else 412)",
    ),
    "nats-expected-last-sequence": (_SEQUENCE, "store only if the stream's last seq is this"),
    "nats-expected-last-subject-sequence": (
        _SEQUENCE,
        "store only if the subject's last seq is this (0: the subject has none)",
    ),
    "nats-expected-last-msg-id": (_MSG_ID, "store only if the last message has this Nats-Msg-Id"),
    "nats-ttl": (
        {"type": "string", **validation.SCHEMAS["ttl"]},
        "the message's TTL: seconds, '30s' or 'never', at least 1 s (ADR-43)",
    ),
    **{
        name.lower(): (dict(schedules.HEADER_SCHEMAS[name]), schedules.DESCRIPTIONS[name])
        for name in schedules.HEADERS
    },
}
# Declared so that clients generated from the spec can send them; the handler reads them from
# the request itself (the lean path shares it), so they are documented here, not parameters.
_PUBLISH_HEADER_PARAMETERS = [
    {
        "name": name,
        "in": "header",
        "required": False,
        "description": _HEADER_DOCS[name.lower()][1],
        "schema": _HEADER_DOCS[name.lower()][0],
    }
    for name in (
        *publish.PUBLISH_HEADERS.values(),
        *(alias.title() for alias in publish.HTTP_ALIASES),
    )
]


@router.post(
    "/{subject:text}",
    access=Need("write", narrowed=True),
    lean=True,
    response_model=PubAck,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=_PUBLISH_ERRORS,
    openapi_extra={
        "parameters": _PUBLISH_HEADER_PARAMETERS,
        "requestBody": {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            }
        },
        **rules(exclusive("Nats-Msg-Id", "Idempotency-Key"), *schedules.spec_rules()),
        **links(
            200,
            stored=link("get_message", stream="$response.body#/stream", seq="$response.body#/seq"),
        ),
    },
)
async def publish_one(
    subject: Annotated[
        str,
        Path(
            description="Subject to publish to (literal; the namespaces $JS, $SYS, _INBOX... "
            "are refused with 403 subject.reserved)",
            json_schema_extra=validation.SCHEMAS["subject"],
        ),
    ],
    request: Request,
    pool: PoolDep,
    publisher: PublisherDep,
    principal: PrincipalDep,
    streams: StreamsDep,
) -> Response:
    """Publish the raw body; answers after the stream's PubAck.

    Headers passed to NATS: Nats-Msg-Id (or Idempotency-Key), Nats-Expected-Stream,
    Nats-Expected-Last-Sequence, Nats-Expected-Last-Subject-Sequence,
    Nats-Expected-Last-Msg-Id, Nats-TTL, the schedule headers (Nats-Schedule,
    Nats-Schedule-Target, -Source, -TTL, -Time-Zone, -Rollup: a delayed or repeated message,
    ADR-51), and user headers as Nats-Header-<Name>.
    """
    subject = validation.publish_subject(subject)
    # Checked once: the schedule's target and source (access below) come from these headers.
    headers = schedules.checked(subject, publish.http_publish_headers(request.headers.items()))
    # The subject is in the path: the access decision comes before the body is read.
    stream = await _may_write(principal, streams, subject)
    await _may_schedule(principal, streams, headers)
    limit = pool.max_payload
    message = publish.fitting(Outgoing(subject, await read_body(request, limit), headers), limit)
    if not principal.anonymous:
        message = publish.for_writer(message, principal, stream, limit)
    # The PubAck JSON is what response_model=PubAck would serialize; built here, both the
    # FastAPI route and the lean path (app.fastpath) send it as it is.
    return JSONBytes(await publisher.publish_json(message))


@router.post(
    "",
    access=Need("write", narrowed=True),
    response_model=PublishBatchResult | AtomicPubAck,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(
        errors.Forbidden,
        errors.NotFound,
        errors.Conflict,
        errors.PreconditionFailed,
        errors.PayloadTooLarge,
        errors.TooManyRequests,
        errors.Unsupported,
    ),
)
async def publish_batch(
    batch: PublishBatch,
    pool: PoolDep,
    publisher: PublisherDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    streams: StreamsDep,
    atomic: Annotated[
        bool,
        Query(
            description="Store all the messages in one stream, or none (ADR-50; the stream "
            "needs allow_atomic): one answer `{stream, seq, batch, count}` or one problem"
        ),
    ] = False,
) -> Any:
    """Publish several messages in order; one result per message, or all or none.

    Every message is validated first: one invalid message rejects the whole batch with
    nothing published. Failures reported by JetStream are per message; with `atomic=true`
    the batch is stored whole or not at all, and any refusal is the answer.
    """
    most = settings.max_publish_batch
    if atomic:
        most = min(most, publish_atomic.MAX_MESSAGES)
        pool.require(features.ATOMIC_BATCH)
    if len(batch.messages) > most:
        raise errors.PayloadTooLarge(
            ErrorCode.PUBLISH_BATCH_TOO_LARGE,
            f"at most {most} messages per {'atomic batch' if atomic else 'batch'}",
        )
    limit = pool.max_payload
    messages = [publish.batch_item(i, item, limit) for i, item in enumerate(batch.messages)]
    if not atomic:
        messages = await _may_publish(principal, streams, messages, limit)
        return {"results": await publisher.publish_batch(messages)}
    # Access first: what the batch's subjects resolve to (stream names, subjects no stream
    # captures) is told only to a token that may write them all.
    messages = await _may_publish(principal, streams, messages, limit)
    publish_atomic.check_rules(messages)
    await publish_atomic.stream_of(streams.capturing_all, messages)
    return await publisher.publish_atomic(messages)


async def _may_publish(
    principal: Principal, streams: StreamService, messages: list[Outgoing], max_payload: int
) -> list[Outgoing]:
    """Each subject needs `write` on the stream that captures it, and a writer limited to
    part of a stream stays in it (:func:`app.publish.service.for_writer`); all checked before
    any publish. Returns the messages as they are sent."""
    if principal.anonymous:
        return messages
    out = []
    for index, message in enumerate(messages):
        stream = await _may_write(principal, streams, message.subject)
        try:
            await _may_schedule(principal, streams, message.headers)
            out.append(publish.for_writer(message, principal, stream, max_payload))
        except errors.GatewayError as exc:
            exc.detail = f"messages[{index}]: {exc.detail}"
            raise
    return out


async def _may_schedule(
    principal: Principal, streams: StreamService, headers: dict[str, str]
) -> None:
    """A schedule (checked before) publishes to its target, which needs write there, and
    copies its source's last message, which needs read there."""
    target, source = schedules.targets(headers)
    if target is not None:
        await _may_write(principal, streams, target)
    if source is not None and not principal.anonymous:
        stream = await streams.capturing(source) or ""
        access.require(principal, "read", Resource("stream", stream, source))


async def _may_write(principal: Principal, streams: StreamService, subject: str) -> str:
    """The stream that captures ``subject``, which the token must be allowed to write there
    (403 otherwise; "" when no stream captures it, which only a grant on every stream
    passes)."""
    if principal.anonymous:
        return ""
    stream = await streams.capturing(subject) or ""
    access.require(principal, "write", Resource("stream", stream, subject))
    return stream
