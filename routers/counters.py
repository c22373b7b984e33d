"""Counters (ADR-49): increments and reads of the values kept by a counting stream."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Request
from starlette.responses import Response

from app import errors, validation
from app.auth.access import STREAM, STREAM_SUBJECT, Need
from app.auth.policy import Resource
from app.counters import schemas
from app.counters.schemas import CounterReadRequest, CounterReadResult, CounterValue, Incremented
from app.deps import CountersDep, PrincipalDep, SettingsDep, StreamName
from app.errors import ErrorCode
from app.http import JSON, problems, read_body
from app.routing import Router

router = Router(prefix="/v1/counters", tags=["counters"])

# Plain path text, validated by the service (validation.stream_name), so that the increment
# and the read of one counter take the lean path (app.fastpath) as publish does.
Stream = Annotated[
    str, Path(description="Stream name", json_schema_extra=validation.SCHEMAS["stream"])
]
Subject = Annotated[
    str,
    Path(
        description="the counter's subject (literal; captured by the stream)",
        json_schema_extra=validation.SCHEMAS["subject"],
    ),
]
# Counters need nats-server 2.12 (501 before that).
_READ_ERRORS = problems(errors.NotFound, errors.Conflict, errors.Unsupported)
_WRITE_ERRORS = problems(
    errors.NotFound, errors.Conflict, errors.PayloadTooLarge, errors.Unsupported
)


def _body_too_large(limit: int) -> errors.GatewayError:
    return errors.PayloadTooLarge(
        ErrorCode.REQUEST_TOO_LARGE, f"an increment's body is at most {limit} bytes"
    )


# A counter on the one-token subject "read" has no route here (``{subject:counter}`` leaves
# that path to the multi read); /v1/streams/{stream}/last/read reads its message.
@router.post(
    "/{stream}/read",
    access=Need("read", STREAM, narrowed=True),
    response_model=CounterReadResult,
    response_class=JSON,
    responses=_WRITE_ERRORS,
)
async def read_counters(
    name: StreamName,
    body: CounterReadRequest,
    counters: CountersDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> Any:
    """The values of the counters matching the subject filters, all as of one sequence.

    Without `up_to_seq` the read is pinned to the stream's last sequence when it starts
    (Direct Get multi_last: the stream needs allow_direct). With auth on, only the counters
    the token may read are returned.
    """
    if len(body.subjects) > settings.max_multi_subjects:
        raise errors.PayloadTooLarge(
            ErrorCode.DIRECT_TOO_MANY_SUBJECTS,
            f"at most {settings.max_multi_subjects} subjects per request",
        )
    visible = None
    if not principal.allows_all("read", "stream", name):
        # Narrowed to the subjects this token may read, never widened (deny rules included),
        # before the service makes anything of the others.
        def visible(subject: str) -> bool:
            return principal.allows("read", Resource("stream", name, subject))

    up_to, values = await counters.read(name, body.subjects, body.up_to_seq, visible)
    return {"up_to_seq": up_to, "counters": values}


@router.post(
    "/{stream}/{subject:counter}",
    access=Need("write", STREAM_SUBJECT),
    lean=True,
    response_model=Incremented,
    response_class=JSON,
    responses=_WRITE_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schemas.INCREMENT_BODY}},
        }
    },
)
async def increment_counter(
    stream: Stream, subject: Subject, request: Request, counters: CountersDep
) -> Response:
    """Add to a counter (negative subtracts); answers its new value after the PubAck.

    The stream needs `allow_msg_counter` (409 `counter.not_allowed`). An increment is not
    idempotent: on 504 `nats.outcome_unknown` read the counter before sending it again.
    """
    body = await read_body(request, schemas.MAX_INCREMENT_BODY, _body_too_large)
    return JSON(await counters.increment(stream, subject, schemas.parse_increment(body)))


@router.get(
    "/{stream}/{subject:counter}",
    access=Need("read", STREAM_SUBJECT),
    lean=True,
    response_model=CounterValue,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=_READ_ERRORS,
)
async def get_counter(stream: Stream, subject: Subject, counters: CountersDep) -> Response:
    """A counter's value: the last message on its subject (404 when never incremented)."""
    return JSON(await counters.get(stream, subject))
