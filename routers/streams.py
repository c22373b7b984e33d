"""Streams: administration, purge, and single messages by sequence."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from starlette.responses import Response

from app import errors, validation
from app.auth import access
from app.auth.access import AUTHENTICATED, STREAM, Need
from app.deps import PrincipalDep, StreamName, StreamsDep
from app.http import JSON, PlainDigits, link, links, problems
from app.routing import Router
from app.schemas import MAX_GO_INT, Message
from app.streams.schemas import PurgeRequest, PurgeResult, StreamConfig, StreamInfo, StreamList

_STREAM, _LISTED = "$request.path.stream", "$response.body#/streams/0/name"


def _reads_of(stream: str) -> dict[str, dict[str, Any]]:
    """The links to what a stream (named by the expression ``stream``) can be read with."""
    return {
        "info": link("get_stream", stream=stream),
        "consumers": link("list_consumers", stream=stream),
        "consumer": link("put_consumer", stream=stream),
        "direct": link("direct_get", stream=stream),
        "multi": link("multi", stream=stream),
        "message": link("get_message", stream=stream),
    }


router = Router(prefix="/v1/streams", tags=["streams"])

Seq = Annotated[int, Path(ge=1, le=2**64 - 1, description="Stream sequence"), PlainDigits]


@router.get(
    "",
    access=AUTHENTICATED,
    response_model=StreamList,
    response_class=JSON,
    responses=problems(),
    openapi_extra=links(200, **_reads_of(_LISTED)),
)
async def list_streams(
    streams: StreamsDep,
    principal: PrincipalDep,
    subject: Annotated[
        str | None,
        Query(
            description="Only streams capturing this subject",
            json_schema_extra=validation.SCHEMAS["subject_filter"],
        ),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_GO_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 256,
) -> Any:
    """List streams with their subjects and state: only those the token may read some of,
    and `total`, `offset` and `limit` count only those."""
    if subject is not None:
        validation.subject_filter(subject)
    if access.sees_account(principal):  # every stream: the server's paging and total hold
        return await streams.list(subject, offset, limit)
    return await streams.list(
        subject,
        offset,
        limit,
        visible=lambda stream: principal.readable_prefixes("stream", stream) != [],
    )


@router.put(
    "/{stream}",
    access=Need("admin", STREAM),
    response_model=StreamInfo,
    response_class=JSON,
    status_code=200,
    responses={
        201: {"description": "Created", "model": StreamInfo},
        **problems(errors.NotFound, errors.Conflict, errors.Unsupported),
    },
    openapi_extra=links(
        200,
        201,
        **_reads_of(_STREAM),
        purge=link("purge_stream", stream=_STREAM),
        delete=link("delete_stream", stream=_STREAM),
    ),
)
async def put_stream(name: StreamName, config: StreamConfig, streams: StreamsDep) -> Any:
    """Create (201) or update (200) a stream from a StreamConfig (NATS field names)."""
    info, created = await streams.put(name, config)
    return JSON(info, status_code=201 if created else 200)


@router.get(
    "/{stream}",
    access=Need("read", STREAM, narrowed=True),
    response_model=StreamInfo,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def get_stream(name: StreamName, streams: StreamsDep) -> Any:
    """Stream info: config (durations in seconds) and state."""
    return await streams.info(name)


@router.delete(
    "/{stream}",
    access=Need("admin", STREAM),
    status_code=204,
    responses=problems(errors.NotFound),
)
async def delete_stream(name: StreamName, streams: StreamsDep) -> Response:
    """Delete a stream and all its messages."""
    await streams.delete(name)
    return Response(status_code=204)


@router.post(
    "/{stream}/purge",
    access=Need("admin", STREAM),
    response_model=PurgeResult,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def purge_stream(
    name: StreamName, streams: StreamsDep, request: PurgeRequest | None = None
) -> Any:
    """Purge messages: all, by subject filter, up to a sequence, or keeping the last N."""
    return {"purged": await streams.purge(name, request or PurgeRequest())}


@router.get(
    "/{stream}/messages/{seq}",
    access=Need("read", STREAM),
    response_model=Message,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def get_message(name: StreamName, seq: Seq, streams: StreamsDep) -> Any:
    """One message by sequence, read from the stream leader (read-after-write)."""
    return await streams.get_message(name, seq)


@router.delete(
    "/{stream}/messages/{seq}",
    access=Need("admin", STREAM),
    status_code=204,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def delete_message(
    name: StreamName,
    seq: Seq,
    streams: StreamsDep,
    erase: Annotated[bool, Query(description="Overwrite the stored bytes too")] = False,
) -> Response:
    """Delete one message by sequence."""
    await streams.delete_message(name, seq, erase=erase)
    return Response(status_code=204)
