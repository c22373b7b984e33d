"""Object buckets (ADR-20): buckets, streamed uploads and downloads, ranges, deletes, watches."""

from __future__ import annotations

import datetime as dt
import email.utils
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import Header, Path, Query, Request
from sse_starlette import EventSourceResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app import errors, validation
from app.auth.access import AUTHENTICATED, OBJ_BUCKET, OBJECT, Need, require
from app.auth.policy import Principal, Resource
from app.deps import ObjDep, PrincipalDep, RuntimeDep, SseSlotsDep
from app.errors import ErrorCode
from app.http import JSON, merged, problems
from app.obj import model
from app.obj.model import ObjectInfo
from app.obj.ranges import span_of
from app.obj.schemas import ObjBucketList, ObjConfig, ObjectInfoModel, ObjectList, ObjStatus
from app.obj.service import Precondition, Span, Upload
from app.routing import Router
from app.schemas import exclusive, rules
from app.sse import sse_response

router = Router(prefix="/v1/obj", tags=["obj"])
log = logging.getLogger("jsgw.obj")


class ObjectStream(Response):
    """An object's content, streamed; stopped when the client goes (as Starlette's
    StreamingResponse is). Content that turns out corrupt on the way (a digest mismatch,
    a missing chunk) ends the response *incomplete*: short of its Content-Length, without
    its last chunk, so that the server closes the connection and the client sees the
    download fail rather than corrupt bytes. That is logged once, as an error."""

    def __init__(
        self, content: AsyncIterator[bytes], status_code: int, headers: dict[str, str]
    ) -> None:
        super().__init__(status_code=status_code, headers=headers)
        self.content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                await self._stream(scope, send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            while (await receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

    async def _stream(self, scope: Scope, send: Send) -> None:
        content = self.content
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for piece in content:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except errors.GatewayError as exc:
            log.error("%s %s: %s: the download is cut off", scope["method"], scope["path"], exc)
            return
        finally:
            with anyio.CancelScope(shield=True):
                await content.aclose()  # type: ignore[attr-defined]
        await send({"type": "http.response.body", "body": b"", "more_body": False})


Bucket = Annotated[
    str,
    Path(
        description="Object bucket name (letters, digits, '-', '_')",
        json_schema_extra=model.BUCKET_SCHEMA,
    ),
]
Name = Annotated[
    str,
    Path(
        description="Object name: 1 to 512 characters, no control characters ('/' allowed)",
        json_schema_extra=model.NAME_SCHEMA,
    ),
]
_OBJECT_PATH = "/{bucket}/objects/{name:text}"
_META_PREFIX = "x-object-meta-"
_META_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_INFO_HEADERS = {
    "ETag": {"description": '"<digest>"', "schema": {"type": "string"}},
    "Last-Modified": {"schema": {"type": "string"}},
}
_CONTENT = {
    "description": "The object's content, streamed; a link is followed",
    "headers": {
        **_INFO_HEADERS,
        "Content-Length": {"schema": {"type": "integer"}},
        "Accept-Ranges": {"schema": {"type": "string", "enum": ["bytes"]}},
    },
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
_RAW_BODY = {
    "requestBody": {
        "description": "the object's content (none: an empty object)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _visible(principal: Principal, bucket: str) -> bool:
    return principal.allows("read", Resource("obj", bucket)) or bool(
        principal.readable_prefixes("obj", bucket)
    )


def _readable(principal: Principal, bucket: str, name: str) -> bool:
    return principal.allows("read", Resource("obj", bucket, name))


def _route(request: Request) -> str:
    route: Any = request.scope.get("route")
    return str(getattr(route, "path_format", "<unmatched>"))


# -- buckets ------------------------------------------------------------------------------------


@router.get(
    "",
    access=AUTHENTICATED,
    response_model=ObjBucketList,
    response_class=JSON,
    responses=problems(),
)
async def list_obj_buckets(obj: ObjDep, principal: PrincipalDep) -> Any:
    """List object buckets with their status."""
    return {"buckets": await obj.list_buckets(lambda b: _visible(principal, b))}


@router.put(
    "/{bucket}",
    access=Need("admin", OBJ_BUCKET),
    response_model=ObjStatus,
    response_class=JSON,
    responses={201: {"description": "Created", "model": ObjStatus}, **problems(errors.Conflict)},
)
async def put_obj_bucket(bucket: Bucket, obj: ObjDep, config: ObjConfig | None = None) -> Any:
    """Create (201) or update (200) an object bucket.

    The stream is always ADR-20's: `OBJ_<bucket>` on `$O.<bucket>.C.>` and `$O.<bucket>.M.>`,
    ttl as max_age, direct get, rollups, discard new.
    """
    status, created = await obj.put_bucket(bucket, config or ObjConfig())
    return JSON(status, status_code=201 if created else 200)


@router.get(
    "/{bucket}",
    access=Need("read", OBJ_BUCKET, narrowed=True),
    response_model=ObjStatus,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def obj_bucket_status(bucket: Bucket, obj: ObjDep) -> Any:
    """Object bucket status (ADR-20)."""
    return await obj.status(bucket)


@router.delete(
    "/{bucket}",
    access=Need("admin", OBJ_BUCKET),
    status_code=204,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def delete_obj_bucket(bucket: Bucket, obj: ObjDep) -> Response:
    """Delete an object bucket and all its objects."""
    await obj.delete_bucket(bucket)
    return Response(status_code=204)


# -- objects ------------------------------------------------------------------------------------


@router.get(
    "/{bucket}/objects",
    access=Need("read", OBJ_BUCKET, narrowed=True),
    response_model=ObjectList,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def list_objects(
    bucket: Bucket,
    obj: ObjDep,
    principal: PrincipalDep,
    include_deleted: Annotated[bool, Query(description="deleted objects too")] = False,
) -> Any:
    """The infos of the bucket's objects, by name (those this token may read)."""
    infos = await obj.list(bucket, include_deleted)
    return {
        "objects": [i.to_json() for i in infos if _readable(principal, bucket, i.name)],
    }


def _upload(request: Request) -> Upload:
    upload = Upload()
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name.startswith(_META_PREFIX):
            key = name[len(_META_PREFIX) :]
            if _META_NAME.fullmatch(key) is None:
                raise errors.InvalidInput(
                    ErrorCode.REQUEST_INVALID,
                    f"X-Object-Meta-<name>: {key!r} is not a name (letters, digits, '-', '_')",
                )
            upload.metadata[key] = validation.header_value(raw_name.decode("latin-1"), value)
        elif name == "content-type":
            upload.headers["Content-Type"] = [value]
        elif name == "x-object-description":
            upload.description = validation.header_value("X-Object-Description", value)
    return upload


def _precondition(if_match: str | None, if_none_match: str | None) -> Precondition:
    if if_match is not None and if_none_match is not None:
        raise _bad_precondition()
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise _bad_precondition()
        return Precondition(create=True)
    if if_match is not None:
        tag = if_match.strip()
        if len(tag) < 2 or not (tag.startswith('"') and tag.endswith('"')):
            raise _bad_precondition()
        return Precondition(digest=tag[1:-1])
    return Precondition()


def _bad_precondition() -> errors.InvalidInput:
    return errors.InvalidInput(
        ErrorCode.OBJ_PRECONDITION_INVALID,
        'If-Match takes one entity tag ("SHA-256=..."), If-None-Match only *, not both',
    )


@router.put(
    _OBJECT_PATH,
    access=Need("write", OBJECT),
    response_model=ObjectInfoModel,
    response_class=JSON,
    responses={
        201: {"description": "Created", "model": ObjectInfoModel, "headers": _INFO_HEADERS},
        200: {"description": "Replaced", "headers": _INFO_HEADERS},
        **problems(errors.NotFound, errors.PreconditionFailed, errors.Conflict),
    },
    openapi_extra=merged(_RAW_BODY, rules(exclusive("If-Match", "If-None-Match"))),
)
async def put_object(
    bucket: Bucket,
    name: Name,
    request: Request,
    obj: ObjDep,
    runtime: RuntimeDep,
    if_match: Annotated[
        str | None,
        Header(
            description='"<digest>": replace only that version (empty: not given)',
            json_schema_extra={"pattern": '^("[^"]+")?$'},
        ),
    ] = None,
    if_none_match: Annotated[
        str | None, Header(description="*: create only", json_schema_extra={"enum": ["*"]})
    ] = None,
    x_object_description: Annotated[
        str | None,
        Header(
            description="kept as the object's description",
            json_schema_extra=validation.SCHEMAS["header_value"],
        ),
    ] = None,
) -> Response:
    """Upload an object: the raw body, streamed into 128 KiB chunks (never buffered whole).

    `Content-Type`, `X-Object-Description` and `X-Object-Meta-<name>` are kept in the
    object's info. `If-None-Match: *` creates only; `If-Match: "<digest>"` replaces only that
    version (412 otherwise, checked before the body is read and again when the upload is
    stored). An upload cut off midway leaves nothing: no object, no chunks. JSGW_MAX_BODY
    does not apply (the bucket's max_bytes does, enforced by the server).
    """
    model.object_name(name)
    # An empty If-Match names no version: it is not given (as the spec's pattern says).
    condition = _precondition(if_match or None, if_none_match)
    upload = _upload(request)
    current = await obj.check(bucket, name, condition)
    counter = runtime.metrics.obj_bytes.labels("in", _route(request))

    async def body() -> AsyncIterator[bytes]:
        async for piece in request.stream():
            if piece:
                counter.inc(len(piece))
                yield piece

    # A client gone midway raises ClientDisconnect out of the body: the service has purged
    # the upload's chunks by then, and app.problems logs it as the ordinary event it is.
    info, created = await obj.put(bucket, name, body(), upload, condition, current)
    return JSON(info.to_json(), status_code=201 if created else 200, headers={"ETag": info.etag})


def _http_date(mtime: str) -> str | None:
    text = re.sub(r"(\.\d{6})\d+", r"\1", mtime.strip())
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return email.utils.format_datetime(when.astimezone(dt.UTC), usegmt=True)


def _tags_hit(if_none_match: str | None, info: ObjectInfo) -> bool:
    if if_none_match is None or not info.digest:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or info.etag in tags


def _content_headers(info: ObjectInfo) -> dict[str, str]:
    headers = {"ETag": info.etag, "Accept-Ranges": "bytes"}
    modified = _http_date(info.mtime)
    if modified:
        headers["Last-Modified"] = modified
    for key, value in info.metadata.items():
        headers[f"X-Object-Meta-{key}"] = value
    if info.description:
        headers["X-Object-Description"] = info.description
    return headers


async def _resolved(
    obj: ObjDep, principal: Principal, bucket: str, name: str
) -> tuple[ObjectInfo, ObjectInfo]:
    model.object_name(name)
    info, target = await obj.resolve(bucket, name)
    if target is not info:
        # A link reads another object: the token must be allowed to read that one too.
        require(principal, "read", Resource("obj", target.bucket, target.name))
    return info, target


def _answer(
    info: ObjectInfo, range_header: str | None, if_none_match: str | None
) -> tuple[int, dict[str, str], Span | None]:
    headers = _content_headers(info)
    if _tags_hit(if_none_match, info):
        return 304, headers, None
    span = span_of(range_header, info.size)
    if span is None:
        headers["Content-Length"] = str(info.size)
        return 200, headers, None
    headers["Content-Length"] = str(span.length)
    headers["Content-Range"] = f"bytes {span.start}-{span.end}/{info.size}"
    return 206, headers, span


@router.get(
    _OBJECT_PATH,
    access=Need("read", OBJECT),
    response_class=Response,
    responses={
        200: _CONTENT,
        206: {"description": "The range asked for (Content-Range)", **_CONTENT},
        304: {"description": "Not modified (If-None-Match)"},
        **problems(errors.NotFound, errors.Conflict, errors.RangeNotSatisfiable),
    },
)
async def get_object(
    bucket: Bucket,
    name: Name,
    request: Request,
    obj: ObjDep,
    principal: PrincipalDep,
    runtime: RuntimeDep,
    range: Annotated[str | None, Header(description="bytes=a-b, bytes=a- or bytes=-n")] = None,
    if_none_match: Annotated[
        str | None, Header(description='304 when one of these entity tags ("<digest>") is current')
    ] = None,
) -> Response:
    """Download an object, streamed (a link is followed).

    `Range` (one range) answers 206 reading only the chunks that hold it; a whole download
    whose content does not match its digest is cut off (the connection is closed before the
    last chunk) rather than served corrupt.
    """
    _, target = await _resolved(obj, principal, bucket, name)
    status, headers, span = _answer(target, range, if_none_match)
    if status == 304:
        return Response(status_code=304, headers=headers)
    counter = runtime.metrics.obj_bytes.labels("out", _route(request))

    async def content() -> AsyncIterator[bytes]:
        async for piece in obj.read(target, span):
            counter.inc(len(piece))
            yield piece

    # The stored type as it was given (a media_type would get a charset added to text/*).
    headers["Content-Type"] = target.content_type or "application/octet-stream"
    return ObjectStream(content(), status, headers)


@router.head(
    _OBJECT_PATH,
    access=Need("read", OBJECT),
    responses={200: _CONTENT, **problems(errors.NotFound)},
)
async def head_object(
    bucket: Bucket,
    name: Name,
    request: Request,
    obj: ObjDep,
    principal: PrincipalDep,
    range: Annotated[str | None, Header(description="bytes=a-b, bytes=a- or bytes=-n")] = None,
    if_none_match: Annotated[str | None, Header(description="304 when current")] = None,
) -> Response:
    """An object's download headers without its content."""
    _, target = await _resolved(obj, principal, bucket, name)
    status, headers, _ = _answer(target, range, if_none_match)
    headers["Content-Type"] = target.content_type or "application/octet-stream"
    return Response(status_code=status, headers=headers)


@router.get(
    "/{bucket}/info/{name:text}",
    access=Need("read", OBJECT),
    response_model=ObjectInfoModel,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def object_info(bucket: Bucket, name: Name, obj: ObjDep) -> Any:
    """An object's info (a link's own info, not its target's)."""
    model.object_name(name)
    info = await obj.info(bucket, name)
    return JSON(info.to_json(), headers={"ETag": info.etag})


@router.delete(
    _OBJECT_PATH,
    access=Need("write", OBJECT),
    status_code=204,
    responses=problems(errors.NotFound, errors.PreconditionFailed),
)
async def delete_object(bucket: Bucket, name: Name, obj: ObjDep) -> Response:
    """Delete an object (ADR-20: a deleted marker stays, its chunks are purged)."""
    model.object_name(name)
    await obj.delete(bucket, name)
    return Response(status_code=204)


# -- watch --------------------------------------------------------------------------------------


@router.get(
    "/{bucket}/watch",
    access=Need("read", OBJ_BUCKET, narrowed=True, sse=True),
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "Server-sent events: `info` (id: the meta message's sequence, data: "
            "ObjectInfo JSON), `ready` once the current infos are sent, `error` before the "
            "gateway ends the stream",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problems(errors.NotFound, errors.TooManyRequests),
    },
)
async def watch_objects(
    bucket: Bucket,
    obj: ObjDep,
    principal: PrincipalDep,
    slots: SseSlotsDep,
    runtime: RuntimeDep,
    request: Request,
    updates_only: Annotated[bool, Query(description="no current infos, only changes")] = False,
    last_event_id: Annotated[
        str | None,
        Header(
            description="resume after this sequence",
            json_schema_extra={"pattern": "^[0-9]{1,19}$"},
        ),
    ] = None,
) -> Response:
    """Watch the bucket's object infos as server-sent events (ADR-20 watch).

    The current info of every object (deleted ones included), then `ready`, then every
    change. `Last-Event-ID` resumes right after that event.
    """
    since = None
    if last_event_id is not None:
        if not last_event_id.isdigit() or len(last_event_id) > 19:
            raise errors.InvalidInput(
                ErrorCode.OBJ_LAST_EVENT_ID_INVALID, "Last-Event-ID is a sequence number"
            )
        since = int(last_event_id)
    await obj.status(bucket)
    release = slots.acquire(principal, request.scope, "obj_watch")
    events = obj.watch(
        bucket,
        since=since,
        updates_only=updates_only,
        visible=lambda n: _readable(principal, bucket, n),
    )
    return sse_response(events, release=release, heartbeat=runtime.settings.sse_heartbeat)
