"""KV (ADR-8): buckets, entries with revisions as entity tags, history, keys, SSE watches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Header, Path, Query, Request
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from app import errors, validation
from app.auth.access import AUTHENTICATED, BUCKET, KEY, Need
from app.auth.policy import Principal, Resource
from app.deps import (
    DirectServiceDep,
    KVDep,
    PoolDep,
    PrincipalDep,
    SettingsDep,
    SseSlotsDep,
)
from app.errors import ErrorCode
from app.http import JSON, PlainDigits, link, links, merged, problems, read_body
from app.kv.http import entry_response, served_by
from app.kv.model import Precondition, etag, stream_name
from app.kv.read import read_at
from app.kv.schemas import (
    KVBucketList,
    KVConfig,
    KVExternal,
    KVHistory,
    KVKeys,
    KVMirror,
    KVMirrorConfig,
    KVMirrorList,
    KVOrigin,
    KVReadRequest,
    KVReadResult,
    KVStatus,
    KVWriteResult,
)
from app.kv.watch import WatchOptions
from app.routing import Router
from app.schemas import exclusive, rules, when
from app.sse import QueueStream

router = Router(prefix="/v1/kv", tags=["kv"])

Bucket = Annotated[
    str,
    Path(
        description="Bucket name (letters, digits, '-', '_')",
        json_schema_extra=validation.SCHEMAS["bucket"],
    ),
]
Key = Annotated[
    str,
    Path(
        description="Key: letters, digits and -/_=. ; no wildcards",
        json_schema_extra=validation.SCHEMAS["key"],
    ),
]
WrittenKey = Annotated[
    str,
    Path(
        description="Key: letters, digits and -/_=. ; no wildcards, not starting with '_kv'",
        json_schema_extra=validation.SCHEMAS["written_key"],
    ),
]
KeyFilter = Annotated[
    str | None,
    Query(
        description="key filter, NATS wildcards * and > as whole tokens",
        json_schema_extra=validation.SCHEMAS["key_filter"],
    ),
]
MirrorName = Annotated[
    str,
    Path(
        description="The mirror's stream name (letters, digits, '-', '_'; not starting with "
        "KV_: a mirror is not a bucket)",
        json_schema_extra={**validation.SCHEMAS["stream"], "not": {"pattern": "^KV_"}},
    ),
]
Revision = Annotated[
    int | None, Query(ge=1, le=2**64 - 1, description="read this revision"), PlainDigits
]
Ttl = Annotated[
    str | None,
    Query(
        description="per-key TTL (ADR-48): seconds, '30s', or 'never', at least 1 second; "
        "needs limit_marker_ttl",
        json_schema_extra=validation.SCHEMAS["ttl"],
    ),
]
IfMatch = Annotated[
    str | None,
    Header(
        description='"<revision>" (or a bare revision): write only over that revision; '
        "*: only over a key that holds a value",
        json_schema_extra={"pattern": f"^({validation.REVISION_TAG}|\\*)$"},
    ),
]
EntityTags = Annotated[
    str | None,
    Header(description='304 when one of these entity tags ("<revision>") is current'),
]
IfNoneMatch = Annotated[
    str | None,
    Header(
        description="*: create; succeeds over a deleted or purged key",
        json_schema_extra={"enum": ["*"]},
    ),
]
Consistency = Annotated[
    Literal["direct", "leader"],
    Query(description="`leader`: read the latest value from the stream leader (read-your-writes)"),
]

_BUCKET, _KEY = "$request.path.bucket", "$request.path.key"
_LISTED, _FIRST_KEY = "$response.body#/buckets/0/bucket", "$response.body#/keys/0"


def _uses_of(bucket: str) -> dict[str, dict[str, Any]]:
    """The links to what a bucket (named by the expression ``bucket``) can be used with."""
    return {
        "status": link("bucket_status", bucket=bucket),
        "keys": link("list_keys", bucket=bucket),
        "put": link("put_key", bucket=bucket),
        "read": link("read", bucket=bucket),
    }


_READ_RULES = rules(when("consistency", equals="leader", forbids=("revision",)))
_SERVED_BY = {
    "KV-Served-By": {
        "description": "the stream that answered: the bucket's, or one of its mirrors "
        "(several, comma-separated, for an answer of several entries)",
        "schema": {"type": "string"},
    }
}
_ENTRY_HEADERS = {
    "ETag": {"description": '"<revision>"', "schema": {"type": "string"}},
    "KV-Revision": {"schema": {"type": "integer"}},
    "KV-Created": {"description": "RFC 3339", "schema": {"type": "string"}},
    "KV-Operation": {"schema": {"type": "string", "enum": ["PUT"]}},
    **_SERVED_BY,
}
_ENTRY_DOC = {
    "description": "The value as the raw body, or Entry JSON with `Accept: application/json`",
    "headers": _ENTRY_HEADERS,
    "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/json": {"schema": {"$ref": "#/components/schemas/KVEntry"}},
    },
}
_RAW_BODY = {
    "requestBody": {
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    }
}
_WATCH_DOC = {
    "description": "Server-sent events: `put`, `delete`, `purge` (id: revision, data: Entry "
    "JSON), `ready` once the initial values are sent (id: the revision to resume from), "
    "`error` before the gateway ends the stream; `: ping` comments as heartbeats",
    "headers": _SERVED_BY,
    "content": {
        "text/event-stream": {
            # OpenAPI 3.1: the schema of one event (3.2 would call it itemSchema).
            "schema": {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"enum": ["put", "delete", "purge", "ready", "error"]},
                    "id": {"type": "string", "pattern": "^[0-9]+$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "description": "put/delete/purge: KVEntry; ready: {revision}; "
                        "error: Problem",
                    },
                },
            }
        }
    },
}


def _may_copy(principal: Principal, bucket: str, stream: str | None = None) -> None:
    """A topology copies a bucket's values where others may read them: whoever makes it must
    read all of the bucket (and of the stream it is copied from, when that is named)."""
    if not principal.allows_all("read", "kv", bucket) or (
        stream is not None and not principal.allows_all("read", "stream", stream)
    ):
        raise errors.Forbidden(
            ErrorCode.AUTH_FORBIDDEN,
            f"copying bucket {bucket!r} needs read on all of it"
            + (f" and on stream {stream!r}" if stream is not None else ""),
        )


def _may_copy_origins(principal: Principal, origins: list[KVOrigin]) -> None:
    for origin in origins:
        _may_copy(principal, origin.bucket, origin.stream)
        _may_reach(principal, origin.external)


def _may_reach(principal: Principal, external: KVExternal | None) -> None:
    """``external`` makes nats-server send consumer requests to ``<api>.CONSUMER.CREATE...``
    and deliver to ``deliver``, across account and domain boundaries a grant cannot name:
    only a token that may administer every stream may aim them."""
    if external is not None and not principal.allows_every("admin", "stream"):
        raise errors.Forbidden(
            ErrorCode.AUTH_FORBIDDEN,
            "external (another account or domain) needs admin on every stream (stream:*)",
        )


def _may_admin_stream(principal: Principal, name: str) -> None:
    """A mirror is a stream: making, changing or deleting it needs what the streams routes
    need (the same 403 whether or not it exists)."""
    if not principal.allows("admin", Resource("stream", name)):
        raise errors.Forbidden(ErrorCode.AUTH_FORBIDDEN, f"needs admin on stream {name!r}")


def _keys_visible(principal: Principal, bucket: str) -> Callable[[str], bool] | None:
    """None when the principal reads the whole bucket; else a check per key."""
    if principal.readable_prefixes("kv", bucket) is None:
        return None
    return lambda key: principal.allows("read", Resource("kv", bucket, key))


# -- buckets ------------------------------------------------------------------------------------


@router.get(
    "",
    access=AUTHENTICATED,
    response_model=KVBucketList,
    response_class=JSON,
    responses=problems(),
    openapi_extra=links(
        200,
        **_uses_of(_LISTED),
    ),
)
async def list_buckets(kv: KVDep, principal: PrincipalDep) -> Any:
    """List buckets with their status."""
    buckets = await kv.buckets.list_all(
        lambda bucket: principal.readable_prefixes("kv", bucket) != []
    )
    return {"buckets": buckets}


@router.put(
    "/{bucket}",
    access=Need("admin", BUCKET),
    response_model=KVStatus,
    response_model_exclude_none=True,
    response_class=JSON,
    responses={
        201: {"description": "Created", "model": KVStatus},
        **problems(errors.NotFound, errors.Conflict, errors.Unsupported),
    },
    openapi_extra=links(
        200,
        201,
        **_uses_of(_BUCKET),
        delete=link("delete_bucket", bucket=_BUCKET),
    ),
)
async def put_bucket(
    bucket: Bucket, kv: KVDep, principal: PrincipalDep, config: KVConfig | None = None
) -> Any:
    """Create (201) or update (200) a bucket.

    The stream is always ADR-8's: `KV_<bucket>` on `$KV.<bucket>.>`, history as
    max_msgs_per_subject, ttl as max_age (duplicate window min(ttl, 2m)), direct get, rollups,
    deny delete, discard new. A body left out means the defaults (history 1, no ttl).

    With `aggregate` the bucket is an ADR-8 Aggregate: its stream sources each origin's keys
    (`$KV.<origin>.<filter>` to `$KV.<bucket>.<filter>`: keys keep their names). Read-only
    (the default) it has no subjects and denies deletes and purges, and writes to it are 409
    `kv.read_only`. An origin bucket that does not exist is 404 `kv.bucket_not_found`, and
    nothing is made. Needs read on every origin bucket (and on its `stream`, when named); an
    origin with `external` needs admin on every stream.
    """
    config = config or KVConfig()
    if config.aggregate is not None:
        _may_copy_origins(principal, config.aggregate.origins)
    status, created = await kv.buckets.put(bucket, config)
    return JSON(status, status_code=201 if created else 200)


@router.get(
    "/{bucket}",
    access=Need("read", BUCKET, narrowed=True),
    response_model=KVStatus,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def bucket_status(bucket: Bucket, kv: KVDep) -> Any:
    """Bucket status (ADR-8 Status) and settings; an aggregate's origins and writability."""
    return await kv.buckets.status(bucket)


@router.delete(
    "/{bucket}",
    access=Need("admin", BUCKET),
    status_code=204,
    responses=problems(errors.NotFound),
)
async def delete_bucket(bucket: Bucket, kv: KVDep) -> Response:
    """Delete a bucket and all its values; its watches end with an `error` event."""
    await kv.buckets.delete(bucket)
    return Response(status_code=204)


# -- topologies (ADR-8: mirrors and aggregates) -------------------------------------------------


@router.get(
    "/{bucket}/mirrors",
    access=Need("read", BUCKET, narrowed=True),
    response_model=KVMirrorList,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound),
)
async def list_mirrors(bucket: Bucket, kv: KVDep, principal: PrincipalDep) -> Any:
    """The bucket's mirrors: their keys, and their lag as the server reports it.

    Only the mirrors whose stream the token may read are listed.
    """

    def visible(stream: str) -> bool:
        return principal.allows("read", Resource("stream", stream))

    return {"mirrors": await kv.buckets.topologies.mirrors(bucket, visible)}


@router.put(
    "/{bucket}/mirrors/{name}",
    access=Need("admin", BUCKET),
    response_model=KVMirror,
    response_model_exclude_none=True,
    response_class=JSON,
    responses={
        201: {"description": "Created", "model": KVMirror},
        **problems(errors.NotFound, errors.Conflict),
    },
    openapi_extra=links(
        200,
        201,
        mirrors=link("list_mirrors", bucket=_BUCKET),
        delete=link("delete_mirror", bucket=_BUCKET, name="$request.path.name"),
    ),
)
async def put_mirror(
    bucket: Bucket,
    name: MirrorName,
    kv: KVDep,
    principal: PrincipalDep,
    config: KVMirrorConfig | None = None,
) -> Any:
    """Create (201) or update (200) a read replica Mirror of the bucket (ADR-8).

    The stream `name` mirrors `KV_<bucket>`. A mirror of every key has `mirror_direct`: the
    server may answer the bucket's reads from the nearest mirror (`KV-Served-By` names the
    stream that did); its `history` and `ttl` default to the bucket's, and a longer ttl is 409
    `kv.mirror_outlives_bucket`. A mirror of some `keys` only is a copy read by its stream
    name, never answering the bucket's reads: nats-server allows that for an `external`
    bucket only (else 409 `kv.mirror_keys_local`). It denies deletes and purges. The bucket must
    allow Direct Get (409 `kv.direct_required`); a stream of that name that is not a mirror
    of the bucket is left alone (409 `kv.not_a_mirror`). Needs admin on stream `name` and
    read on all of the bucket as well; `external` needs admin on every stream.
    """
    _may_admin_stream(principal, name)
    _may_copy(principal, bucket)
    config = config or KVMirrorConfig()
    _may_reach(principal, config.external)
    mirror, created = await kv.buckets.topologies.put_mirror(bucket, name, config)
    return JSON(mirror, status_code=201 if created else 200)


@router.delete(
    "/{bucket}/mirrors/{name}",
    access=Need("admin", BUCKET),
    status_code=204,
    responses=problems(errors.NotFound),
)
async def delete_mirror(
    bucket: Bucket, name: MirrorName, kv: KVDep, principal: PrincipalDep
) -> Response:
    """Delete a mirror of the bucket (404 for any stream that is not one).

    Needs admin on stream `name` as well.
    """
    _may_admin_stream(principal, name)
    await kv.buckets.topologies.delete_mirror(bucket, name)
    return Response(status_code=204)


@router.post(
    "/{bucket}/origins",
    access=Need("admin", BUCKET),
    response_model=KVStatus,
    response_model_exclude_none=True,
    response_class=JSON,
    responses=problems(errors.NotFound, errors.Conflict),
)
async def add_origin(bucket: Bucket, origin: KVOrigin, kv: KVDep, principal: PrincipalDep) -> Any:
    """Add an origin to an aggregate (ADR-8 AddAggregateOrigin); the bucket's status.

    409 `kv.not_aggregate` for a bucket that sources nothing, 409 `kv.origin_exists` for an
    origin it already has (the same stream and external API): nothing is changed then. Needs
    read on the origin bucket (and on its `stream`, when named); `external` needs admin on
    every stream.
    """
    _may_copy_origins(principal, [origin])
    return await kv.buckets.topologies.add_origin(bucket, origin)


@router.get(
    "/{bucket}/keys",
    access=Need("read", BUCKET, narrowed=True),
    response_model=KVKeys,
    response_class=JSON,
    responses={200: {"description": "OK", "headers": _SERVED_BY}, **problems(errors.NotFound)},
    openapi_extra=links(
        200,
        get=link("get_key", bucket=_BUCKET, key=_FIRST_KEY),
        history=link("history", bucket=_BUCKET, key=_FIRST_KEY),
        put=link("put_key", bucket=_BUCKET, key=_FIRST_KEY),
    ),
)
async def list_keys(
    bucket: Bucket,
    kv: KVDep,
    principal: PrincipalDep,
    filter: KeyFilter = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Annotated[
        str | None,
        Query(
            description="next_cursor of the previous page",
            json_schema_extra={"pattern": f"^[0-9]{{0,{validation.REVISION_DIGITS}}}$"},
        ),
    ] = None,
) -> Any:
    """Keys holding a value (deleted and purged keys left out), a page at a time.

    Keys come in the order of their latest revision. A page may hold fewer than `limit` keys
    while `next_cursor` is not null; `null` means the listing is complete. As with Redis
    SCAN, a key written during the listing may be listed twice or missed.
    """
    keys, next_cursor = await kv.keys(
        bucket, filter, limit=limit, cursor=cursor, visible=_keys_visible(principal, bucket)
    )
    return JSON(
        {"keys": keys, "next_cursor": next_cursor},
        headers={"KV-Served-By": stream_name(bucket)},
    )


# -- entries ------------------------------------------------------------------------------------


@router.get(
    "/{bucket}/keys/{key:text}",
    access=Need("read", KEY),
    lean=True,
    response_class=Response,
    responses={200: _ENTRY_DOC, 304: {"description": "Not modified"}, **problems(errors.NotFound)},
    openapi_extra=_READ_RULES,
)
async def get_key(
    bucket: Bucket,
    key: Key,
    request: Request,
    kv: KVDep,
    revision: Revision = None,
    if_none_match: EntityTags = None,
    consistency: Consistency = "direct",
) -> Response:
    """A key's value (latest, or `?revision=`), by Direct Get.

    Raw bytes with `ETag: "<revision>"`, `KV-Revision`, `KV-Created` and `KV-Operation`, or
    Entry JSON with `Accept: application/json`. `If-None-Match: "<revision>"` answers 304 when
    that is still the current revision. A deleted or purged key is 404, with the revision of
    the delete in the problem.

    `consistency=leader` reads the latest value from the stream leader
    (`$JS.API.STREAM.MSG.GET`), never from the read cache or a replica: a value acknowledged
    to any writer before the read started is seen (read-your-writes). Direct Get may be
    answered by a replica that has not caught up yet, most visibly during a partition; but
    reads of the latest value through one gateway process never go back behind a revision
    of the key it has served or written (such an answer is read again from the leader).
    """
    entry = await kv.get(bucket, key, revision, leader=consistency == "leader")
    return entry_response(entry, request.headers, if_none_match)


@router.head(
    "/{bucket}/keys/{key:text}",
    access=Need("read", KEY),
    lean=True,
    response_class=Response,
    responses={
        200: {"description": "As GET, without a body", "headers": _ENTRY_HEADERS},
        304: {"description": "Not modified"},
        **problems(errors.NotFound),
    },
    openapi_extra=_READ_RULES,
)
async def head_key(
    bucket: Bucket,
    key: Key,
    request: Request,
    kv: KVDep,
    revision: Revision = None,
    if_none_match: EntityTags = None,
    consistency: Consistency = "direct",
) -> Response:
    """A key's metadata: the headers of GET, no body."""
    full = await get_key(bucket, key, request, kv, revision, if_none_match, consistency)
    return Response(status_code=full.status_code, headers=dict(full.headers))


@router.put(
    "/{bucket}/keys/{key:text}",
    access=Need("write", KEY),
    lean=True,
    response_model=KVWriteResult,
    response_class=JSON,
    status_code=200,
    responses={
        201: {"description": "Created (If-None-Match: *)", "model": KVWriteResult},
        **problems(
            errors.NotFound,
            errors.Conflict,
            errors.PreconditionFailed,
            errors.PayloadTooLarge,
            errors.Unsupported,
        ),
    },
    openapi_extra=merged(
        _RAW_BODY,
        rules(exclusive("If-Match", "If-None-Match"), when("ttl", requires=("If-None-Match",))),
        links(
            200,
            201,
            get=link("get_key", bucket=_BUCKET, key=_KEY),
            revision=link("get_key", bucket=_BUCKET, key=_KEY, revision="$response.body#/revision"),
            head=link("head_key", bucket=_BUCKET, key=_KEY),
            history=link("history", bucket=_BUCKET, key=_KEY),
            delete=link("delete_key", bucket=_BUCKET, key=_KEY),
        ),
    ),
)
async def put_key(
    bucket: Bucket,
    key: WrittenKey,
    request: Request,
    kv: KVDep,
    pool: PoolDep,
    ttl: Ttl = None,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Store the raw body as the key's value.

    No precondition: put. `If-None-Match: *`: create (ADR-8: also over a key whose last
    operation is a delete or purge), 201. `If-Match: "<revision>"`: update only if that is
    the key's current revision (`Nats-Expected-Last-Subject-Sequence`). A failed precondition
    is 412 with the current `revision` in the problem. `?ttl=` only with create (ADR-48).
    """
    precondition = Precondition.from_headers(if_match, if_none_match)
    value = await read_body(request, pool.max_payload)
    revision, created = await kv.put(bucket, key, value, precondition, ttl)
    headers = {"ETag": etag(revision), "KV-Revision": str(revision)}
    if created:
        headers["Location"] = str(request.url.path)
    return JSON({"revision": revision}, status_code=201 if created else 200, headers=headers)


@router.delete(
    "/{bucket}/keys/{key:text}",
    access=Need("write", KEY),
    lean=True,
    status_code=204,
    responses=problems(
        errors.NotFound,
        errors.Conflict,
        errors.PreconditionFailed,
        errors.PayloadTooLarge,
        errors.Unsupported,
    ),
    openapi_extra=rules(when("ttl", requires=("purge=true",))),
)
async def delete_key(
    bucket: Bucket,
    key: WrittenKey,
    kv: KVDep,
    purge: Annotated[bool, Query(description="drop the history too (Nats-Rollup: sub)")] = False,
    ttl: Annotated[
        str | None,
        Query(
            description="purge only: how long the purge marker stays (as the per-key ttl)",
            json_schema_extra=validation.SCHEMAS["ttl"],
        ),
    ] = None,
    if_match: IfMatch = None,
    if_none_match: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Delete a key: a `DEL` marker that keeps the history, or with `?purge=true` a `PURGE`
    marker that removes it. Always writes a marker (ADR-8), so deleting an absent key is a
    204 too; `If-Match` makes it conditional. The marker's revision is in `KV-Revision`."""
    precondition = Precondition.from_headers(if_match, if_none_match)
    revision = await kv.delete(bucket, key, purge=purge, precondition=precondition, ttl=ttl)
    return Response(status_code=204, headers={"KV-Revision": str(revision)})


@router.get(
    "/{bucket}/history/{key:text}",
    access=Need("read", KEY),
    response_model=KVHistory,
    response_model_exclude_none=True,
    response_class=JSON,
    responses={200: {"description": "OK", "headers": _SERVED_BY}, **problems(errors.NotFound)},
)
async def history(bucket: Bucket, key: Key, kv: KVDep) -> Any:
    """Every stored revision of a key, oldest first, deletes and purges included.

    `delta` counts the newer revisions of the key (0 for the latest).
    """
    entries = await kv.history(bucket, key)
    return JSON({"entries": [entry.to_json() for entry in entries]}, headers=served_by(entries))


@router.post(
    "/{bucket}/read",
    access=Need("read", BUCKET, narrowed=True),
    response_model=KVReadResult,
    response_model_exclude_none=True,
    response_class=JSON,
    responses={
        200: {"description": "OK", "headers": _SERVED_BY},
        **problems(errors.NotFound, errors.Conflict, errors.PayloadTooLarge),
    },
)
async def read(
    bucket: Bucket,
    body: KVReadRequest,
    direct: DirectServiceDep,
    kv: KVDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> Any:
    """Consistent multi-key read: the entries of the keys as of one bucket revision.

    Every server request (filters are split per 1,024 subjects, and paged) is pinned to the
    same revision: `at_revision`, the revision at `at_time`, or the bucket's last revision when
    the read starts. Deleted and purged keys are left out unless `include_deleted`. A filter
    matching more than 1,024 keys is refused (413): list the keys, or narrow the filter.
    """
    validation.bucket_name(bucket)
    if len(body.keys) > settings.max_multi_subjects:
        raise errors.PayloadTooLarge(
            ErrorCode.DIRECT_TOO_MANY_SUBJECTS,
            f"at most {settings.max_multi_subjects} keys per request",
        )
    if body.at_revision is not None and body.at_time is not None:
        raise errors.InvalidInput(
            ErrorCode.REQUEST_INVALID, "at_revision and at_time exclude each other"
        )
    revision, entries = await read_at(
        direct,
        bucket,
        body.keys,
        at_revision=body.at_revision,
        at_time=body.at_time,
        include_deleted=body.include_deleted,
        on_mirrored=kv.count_stale_read,
    )
    if not principal.allows_all("read", "kv", bucket):
        # Narrowed to the keys this token may read, never widened (deny rules included).
        entries = [e for e in entries if principal.allows("read", Resource("kv", bucket, e.key))]
    return JSON(
        {"revision": revision, "entries": [entry.to_json() for entry in entries]},
        headers=served_by(entries),
    )


# -- watch --------------------------------------------------------------------------------------


@router.get(
    "/{bucket}/watch",
    access=Need("read", BUCKET, narrowed=True, sse=True),
    lean=True,
    response_class=EventSourceResponse,
    responses={200: _WATCH_DOC, **problems(errors.NotFound, errors.TooManyRequests)},
)
async def watch(
    bucket: Bucket,
    kv: KVDep,
    principal: PrincipalDep,
    slots: SseSlotsDep,
    request: Request,
    key: Annotated[
        str | None,
        Query(
            description="key, or filter with * and >; default: all",
            json_schema_extra=validation.SCHEMAS["key_filter"],
        ),
    ] = None,
    history: Annotated[bool, Query(description="send all stored revisions first")] = False,
    ignore_deletes: Annotated[bool, Query(description="only PUT entries")] = False,
    meta_only: Annotated[bool, Query(description="entries without values")] = False,
    updates_only: Annotated[bool, Query(description="no current values, only changes")] = False,
    since: Annotated[
        int | None,
        Query(ge=0, le=2**64 - 1, description="resume after this revision"),
        PlainDigits,
    ] = None,
    last_event_id: Annotated[str | None, Header(description="resume after this revision")] = None,
) -> Response:
    """Watch keys as server-sent events (ADR-8 watch).

    Without options: the current value of every matching key (deletes included), then
    `ready`, then every change. `Last-Event-ID` (sent by browsers on reconnect) or `?since=`
    resumes right after that revision, with no gap and no repeat.
    """
    options = WatchOptions.parse(
        key,
        history=history,
        ignore_deletes=ignore_deletes,
        meta_only=meta_only,
        updates_only=updates_only,
        since=since,
        last_event_id=last_event_id,
    )
    release = slots.acquire(principal, request.scope, "kv_watch")
    try:
        session = await kv.watch(bucket, options, _keys_visible(principal, bucket))
    except BaseException:
        await release()
        raise

    async def finish() -> None:
        try:
            await session.close()
        finally:
            await release()

    # A watch always reads the bucket's own stream (mirrors answer Direct Gets only).
    return QueueStream(session, finish, headers={"KV-Served-By": stream_name(bucket)})
