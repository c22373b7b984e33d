"""Direct Get (ADR-31): single messages, NDJSON batches, consistent multi-subject reads; and
sequence ranges of any stream (through a consumer), answered as the batches are."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import Path, Query, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from app import errors, validation
from app.auth import access
from app.auth.access import DIRECT, STREAM, STREAM_FILTER, STREAM_SUBJECT, Need
from app.auth.policy import Resource
from app.config import Settings
from app.deps import DirectServiceDep, PrincipalDep, SettingsDep, StreamName
from app.direct import arrow
from app.direct.schemas import MultiRequest, MultiResult
from app.direct.service import SingleQuery
from app.errors import ErrorCode
from app.http import JSON, PlainDigits, problems, wants_json
from app.nats.direct import EndOfBatch, StoredMessage
from app.routing import Router
from app.schemas import TimeText, any_of, exclusive, rules, when

router = Router(prefix="/v1/streams", tags=["direct get"])

NDJSON = "application/x-ndjson"
_RAW_DOC = {
    "description": "The message: raw body and Nats-* headers, or Message JSON "
    "with `Accept: application/json`; a batch is NDJSON",
    "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/json": {"schema": {"$ref": "#/components/schemas/Message"}},
        NDJSON: {
            "schema": {"$ref": "#/components/schemas/EndOfBatchLine"},
            "description": "one Message JSON per line, then an EndOfBatchLine",
        },
        arrow.ARROW_STREAM: {
            "schema": {"type": "string", "format": "binary"},
            "description": "a batch as an Arrow IPC stream (when asked for with Accept): "
            "columns stream, subject, seq, time, headers, data; the last batch has no rows "
            "and carries the end of batch in its custom metadata",
        },
    },
}
_BATCH_DOC = {
    "description": "The messages as NDJSON (one Message JSON a line, then an EndOfBatchLine) "
    "or, when asked for with Accept, an Arrow IPC stream",
    "content": {
        NDJSON: {
            "schema": {"$ref": "#/components/schemas/EndOfBatchLine"},
            "description": "one Message JSON per line, then an EndOfBatchLine",
        },
        arrow.ARROW_STREAM: {
            "schema": {"type": "string", "format": "binary"},
            "description": "an Arrow IPC stream: columns stream, subject, seq, time, headers, "
            "data; the last batch has no rows and carries the end of batch in its custom "
            "metadata",
        },
    },
}
_READ_ERRORS = problems(errors.NotFound, errors.Conflict, errors.PayloadTooLarge)
# Batches, multi_last and start times need nats-server 2.11 (501 before that).
_BATCH_ERRORS = problems(
    errors.NotFound, errors.Conflict, errors.PayloadTooLarge, errors.Unsupported
)


def message_response(message: StoredMessage, request: Request) -> Response:
    if wants_json(request.headers):
        return JSON(message.to_json())
    headers = {
        "Nats-Stream": message.stream,
        "Nats-Subject": message.subject,
        "Nats-Sequence": str(message.seq),
    }
    if message.time:
        headers["Nats-Time-Stamp"] = message.time
    for name, values in message.headers.items():
        # Stored headers go back the way they came in on publish, when HTTP can carry them.
        if values and _http_safe(name) and _http_safe(values[-1]):
            headers[f"Nats-Header-{name}"] = values[-1]
    return Response(message.data, media_type="application/octet-stream", headers=headers)


def _http_safe(text: str) -> bool:
    return text.isascii() and text.isprintable() and len(text) <= 4096


@router.get(
    "/{stream}/direct",
    access=Need("read", DIRECT),
    responses={200: _RAW_DOC, **_BATCH_ERRORS, **arrow.RESPONSES},
    response_class=Response,
    openapi_extra=rules(
        # A batch read without a start begins at seq 1; a single read needs one.
        any_of("seq", "last_by_subj", "next_by_subj", "start_time", "batch", "max_bytes"),
        when("last_by_subj", forbids=("seq", "next_by_subj", "start_time", "batch", "max_bytes")),
        exclusive("seq", "start_time"),
        when("consistency", equals="leader", forbids=("batch", "max_bytes")),
    ),
)
async def direct_get(
    name: StreamName,
    request: Request,
    service: DirectServiceDep,
    settings: SettingsDep,
    seq: Annotated[int | None, Query(ge=1, le=2**64 - 1), PlainDigits] = None,
    last_by_subj: Annotated[
        str | None,
        Query(
            description="last message on this subject",
            json_schema_extra=validation.SCHEMAS["subject"],
        ),
    ] = None,
    next_by_subj: Annotated[
        str | None,
        Query(
            description="first message at/after seq on this subject",
            json_schema_extra=validation.SCHEMAS["subject"],
        ),
    ] = None,
    start_time: Annotated[
        TimeText | None, Query(description="first message at/after this RFC 3339 time")
    ] = None,
    batch: Annotated[
        int | None,
        Query(
            ge=1,
            le=Settings.model_fields["max_direct_batch"].default,
            description="read up to this many messages (NDJSON; at most JSGW_MAX_DIRECT_BATCH)",
        ),
    ] = None,
    max_bytes: Annotated[int | None, Query(ge=1, description="byte budget of a batch read")] = None,
    consistency: Annotated[Literal["direct", "leader"], Query()] = "direct",
) -> Response:
    """Read one message (by seq, subject or time), or a batch of messages as NDJSON.

    A batch read (`batch` or `max_bytes`) starts at `seq`, `next_by_subj` or `start_time`,
    else at the stream's first message.

    `consistency=leader` reads a single message from the stream leader
    (`$JS.API.STREAM.MSG.GET`) for read-after-write; Direct Get may be answered by a replica
    or a mirror that has not caught up yet.
    """
    query = SingleQuery(seq, last_by_subj, next_by_subj, start_time)
    if batch is None and max_bytes is None:
        return message_response(
            await service.get(name, query, leader=consistency == "leader"), request
        )
    if consistency == "leader":
        raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, "batch reads are Direct Get only")
    limit = batch or settings.max_direct_batch
    if limit > settings.max_direct_batch:
        raise errors.InvalidInput(
            ErrorCode.REQUEST_INVALID, f"batch is limited to {settings.max_direct_batch} messages"
        )
    use_arrow = arrow.check_available(request.headers.get("accept", ""))
    return await _batch_response(
        service.batch(name, query, limit=limit, max_bytes=max_bytes), use_arrow
    )


async def _batch_response(
    items: AsyncIterator[list[StoredMessage] | EndOfBatch], use_arrow: bool
) -> Response:
    """A batch read streamed as Arrow IPC or NDJSON. The first item is read before answering,
    so that the errors of starting the read are proper problem responses; what follows
    streams as it arrives."""
    first = await anext(aiter(items))
    # The reader holds a subscription (and maybe a consumer): if the client leaves before the
    # body starts, the encoder never runs its own cleanup, so the response closes the reader
    # afterwards.
    close = BackgroundTask(items.aclose)  # type: ignore[attr-defined]
    if use_arrow:
        return StreamingResponse(
            arrow.encode(first, items), media_type=arrow.ARROW_STREAM, background=close
        )
    return StreamingResponse(_ndjson(first, items), media_type=NDJSON, background=close)


@router.get(
    "/{stream}/messages",
    access=Need("read", STREAM_FILTER),
    responses={200: _BATCH_DOC, **_READ_ERRORS, **arrow.RESPONSES},
    response_class=Response,
    tags=["streams"],
)
async def read_messages(
    name: StreamName,
    request: Request,
    service: DirectServiceDep,
    principal: PrincipalDep,
    start_seq: Annotated[
        int, Query(ge=1, le=2**64 - 1, description="first sequence to read"), PlainDigits
    ] = 1,
    end_seq: Annotated[
        int | None,
        Query(
            ge=1,
            le=2**64 - 1,
            description="last sequence to read (inclusive); by default the stream's last "
            "sequence when the read starts",
        ),
        PlainDigits,
    ] = None,
    subject: Annotated[
        str | None,
        Query(
            description="only messages on subjects matching this filter",
            json_schema_extra=validation.SCHEMAS["subject_filter"],
        ),
    ] = None,
) -> Response:
    """Read a range of sequences of any stream, as NDJSON or Arrow IPC like a batch Direct Get.

    Served by an ephemeral ordered consumer, so the stream needs no `allow_direct`; the
    consumer is deleted when the answer ends or the client goes away. The answer streams at
    the client's pace. It ends with the end-of-batch line (or Arrow marker) whose `last_seq`
    is the last sequence of the range read: `end_seq`, or the stream's last sequence when the
    read started if that is lower. A range past the end, or `end_seq` below `start_seq`,
    reads nothing.
    """
    access.check_read_filter(principal, name, subject)
    use_arrow = arrow.check_available(request.headers.get("accept", ""))
    if end_seq is not None and end_seq < start_seq:
        end_seq = start_seq - 1
    return await _batch_response(service.read_range(name, start_seq, end_seq, subject), use_arrow)


async def _ndjson(
    first: list[StoredMessage] | EndOfBatch,
    rest: AsyncIterator[list[StoredMessage] | EndOfBatch],
) -> AsyncIterator[bytes]:
    item: list[StoredMessage] | EndOfBatch = first
    dumps = orjson.dumps
    try:
        while True:
            if isinstance(item, EndOfBatch):
                line = {"eob": True, "num_pending": item.num_pending, "last_seq": item.last_seq}
                yield dumps(line) + b"\n"
                return
            # A page (up to 1,000 messages) is one chunk: one write to the socket.
            yield b"".join([dumps(message.to_json()) + b"\n" for message in item])
            item = await anext(rest)
    except errors.GatewayError as exc:
        # Headers are gone already: the error becomes the last line, in place of the EOB.
        yield dumps({"error": exc.problem()}) + b"\n"
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


@router.get(
    "/{stream}/last/{subject:text}",
    access=Need("read", STREAM_SUBJECT),
    responses={200: _RAW_DOC, **_READ_ERRORS},
    response_class=Response,
)
async def last_by_subject(
    name: StreamName,
    subject: Annotated[
        str, Path(description="literal subject", json_schema_extra=validation.SCHEMAS["subject"])
    ],
    request: Request,
    service: DirectServiceDep,
) -> Response:
    """The last message on a subject (subject-appended Direct Get)."""
    return message_response(await service.last_for(name, subject), request)


@router.post(
    "/{stream}/direct/multi",
    access=Need("read", STREAM, narrowed=True),
    response_model=MultiResult,
    response_class=JSON,
    responses=_BATCH_ERRORS,
)
async def multi(
    name: StreamName,
    body: MultiRequest,
    service: DirectServiceDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> Any:
    """Consistent multi-subject read: the last message of each subject as of one sequence.

    Without `up_to_seq`/`up_to_time` the read is pinned to the stream's last sequence when it
    starts. Lists over 1024 subjects are split into several server requests, all pinned to
    the same `up_to_seq`; a wildcard matching over 1024 subjects is refused (413).
    """
    if len(body.subjects) > settings.max_multi_subjects:
        raise errors.PayloadTooLarge(
            ErrorCode.DIRECT_TOO_MANY_SUBJECTS,
            f"at most {settings.max_multi_subjects} subjects per request",
        )
    up_to, messages = await service.multi(
        name,
        body.subjects,
        up_to_seq=body.up_to_seq,
        up_to_time=body.up_to_time,
        page_size=body.batch,
    )
    if not principal.allows_all("read", "stream", name):
        # Narrowed to the subjects this token may read, never widened (deny rules included).
        messages = [
            m for m in messages if principal.allows("read", Resource("stream", name, m.subject))
        ]
    return {"up_to_seq": up_to, "messages": [m.to_json() for m in messages]}
