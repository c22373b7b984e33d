"""Which action on which resource each route needs, checked before its handler runs.

One table for the whole API, keyed by route template, so a route cannot forget its check:
a ``/v1`` route missing from the table is refused (default deny). Routes that read with
wildcards (listings, watches, multi reads) need only some access to the bucket or stream here;
their handlers narrow the results to what the principal may read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from app import errors
from app.auth.guard import SSE_COOKIE, SSE_QUERY, Authenticator
from app.auth.policy import ANONYMOUS, Principal, Resource
from app.errors import ErrorCode
from app.tls import client_cert_name

Params = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Need:
    action: str
    resource: Callable[[Params, Request], Resource] | None = None
    narrowed: bool = False  # some access in the bucket/stream is enough; the handler narrows
    sse: bool = False  # may authenticate with a short-lived SSE token


def _stream(p: Params, _: Request) -> Resource:
    return Resource("stream", p["stream"])


def _stream_subject(p: Params, _: Request) -> Resource:
    return Resource("stream", p["stream"], p["subject"])


def _direct(p: Params, request: Request) -> Resource:
    q = request.query_params
    subject = q.get("last_by_subj") or q.get("next_by_subj")
    return Resource("stream", p["stream"], subject)


def _bucket(p: Params, _: Request) -> Resource:
    return Resource("kv", p["bucket"])


def _key(p: Params, _: Request) -> Resource:
    return Resource("kv", p["bucket"], p["key"])


def _consumer(p: Params, _: Request) -> Resource:
    return Resource("consumer", f"{p['stream']}/{p['consumer']}")


AUTHENTICATED = Need("authenticated")
PUBLIC = Need("public")

TABLE: dict[tuple[str, str], Need] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/v1/info"): AUTHENTICATED,
    ("POST", "/v1/auth/sse-token"): AUTHENTICATED,
    # streams
    ("GET", "/v1/streams"): AUTHENTICATED,
    ("PUT", "/v1/streams/{stream}"): Need("admin", _stream),
    ("GET", "/v1/streams/{stream}"): Need("read", _stream, narrowed=True),
    ("DELETE", "/v1/streams/{stream}"): Need("admin", _stream),
    ("POST", "/v1/streams/{stream}/purge"): Need("admin", _stream),
    ("GET", "/v1/streams/{stream}/messages/{seq}"): Need("read", _stream),
    ("DELETE", "/v1/streams/{stream}/messages/{seq}"): Need("admin", _stream),
    # publish: the handler checks each subject against the stream that captures it
    ("POST", "/v1/publish/{subject}"): Need("write", narrowed=True),
    ("POST", "/v1/publish"): Need("write", narrowed=True),
    # direct get
    ("GET", "/v1/streams/{stream}/direct"): Need("read", _direct),
    ("GET", "/v1/streams/{stream}/last/{subject}"): Need("read", _stream_subject),
    ("POST", "/v1/streams/{stream}/direct/multi"): Need("read", _stream, narrowed=True),
    # kv
    ("GET", "/v1/kv"): AUTHENTICATED,
    ("PUT", "/v1/kv/{bucket}"): Need("admin", _bucket),
    ("GET", "/v1/kv/{bucket}"): Need("read", _bucket, narrowed=True),
    ("DELETE", "/v1/kv/{bucket}"): Need("admin", _bucket),
    ("GET", "/v1/kv/{bucket}/keys"): Need("read", _bucket, narrowed=True),
    ("GET", "/v1/kv/{bucket}/keys/{key}"): Need("read", _key),
    ("HEAD", "/v1/kv/{bucket}/keys/{key}"): Need("read", _key),
    ("PUT", "/v1/kv/{bucket}/keys/{key}"): Need("write", _key),
    ("DELETE", "/v1/kv/{bucket}/keys/{key}"): Need("write", _key),
    ("GET", "/v1/kv/{bucket}/history/{key}"): Need("read", _key),
    ("GET", "/v1/kv/{bucket}/watch"): Need("read", _bucket, narrowed=True, sse=True),
    ("POST", "/v1/kv/{bucket}/read"): Need("read", _bucket, narrowed=True),
    # consumers
    ("GET", "/v1/streams/{stream}/consumers"): Need("read", _stream),
    ("PUT", "/v1/streams/{stream}/consumers/{consumer}"): Need("admin", _consumer),
    ("GET", "/v1/streams/{stream}/consumers/{consumer}"): Need("consume", _consumer),
    ("DELETE", "/v1/streams/{stream}/consumers/{consumer}"): Need("admin", _consumer),
    ("POST", "/v1/streams/{stream}/consumers/{consumer}/fetch"): Need("consume", _consumer),
    ("POST", "/v1/streams/{stream}/consumers/{consumer}/next"): Need("consume", _consumer),
    ("GET", "/v1/streams/{stream}/consumers/{consumer}/consume"): Need(
        "consume", _consumer, sse=True
    ),
    ("POST", "/v1/streams/{stream}/consumers/{consumer}/ack"): Need("consume", _consumer),
    ("POST", "/v1/streams/{stream}/consumers/{consumer}/unpin"): Need("consume", _consumer),
}


def _forbidden() -> errors.Forbidden:
    # The same answer whether or not the resource exists.
    return errors.Forbidden(ErrorCode.AUTH_FORBIDDEN, "this token may not do that")


def need_for(method: str, template: str) -> Need | None:
    need = TABLE.get((method, template))
    if need is None and method == "HEAD":
        need = TABLE.get(("GET", template))
    return need


def check(principal: Principal, need: Need, resource: Resource | None) -> None:
    if need.action in ("public", "authenticated") or resource is None:
        return
    if resource.item is None and need.action == "read" and not need.narrowed:
        # A read of the whole (by sequence: any subject may come back) needs every item;
        # a deny rule on some subjects of the stream takes it away.
        allowed = principal.allows_all("read", resource.kind, resource.name)
    else:
        allowed = principal.allows(need.action, resource)
    if allowed:
        return
    if need.narrowed and principal.readable_prefixes(resource.kind, resource.name, need.action):
        return
    raise _forbidden()


def require(principal: Principal, action: str, resource: Resource) -> None:
    """For handlers that check items themselves (publish subjects, results of wildcard reads)."""
    if not principal.allows(action, resource):
        raise _forbidden()


async def authorize(request: Request) -> Principal:
    """App-wide dependency: who is calling, and may they use this route on this resource."""
    authenticator: Authenticator = request.state.runtime.auth
    route = request.scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", "")
    need = need_for(request.method, template)
    if not authenticator.enabled or need is PUBLIC:
        return ANONYMOUS
    if need is None:
        raise _forbidden()
    sse_token = None
    if need.sse:
        sse_token = request.query_params.get(SSE_QUERY) or request.cookies.get(SSE_COOKIE)
    principal = authenticator.authenticate(
        request.headers.get("authorization"), sse_token, client_cert_name(request.scope)
    )
    authenticator.limit(principal)
    resource = need.resource(request.path_params, request) if need.resource else None
    check(principal, need, resource)
    return principal
