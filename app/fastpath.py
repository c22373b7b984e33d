"""Lean paths for the hottest requests: the plain forms of ``GET`` and ``PUT
/v1/kv/{bucket}/keys/{key}`` and ``POST /v1/publish/{subject}``.

FastAPI's routing, dependency solving and response machinery cost several times the work of
these requests. :class:`app.main.Gateway` hands the requests these paths :meth:`LeanPaths.take`
to them, inside the gateway's own middleware (request ids, metrics, access log, limits, CORS)
but past Starlette's and FastAPI's layers. Each path authorizes through the same table and
calls the route's own endpoint function (or, for the read, the same service and response
helpers) with what FastAPI would have passed it, so answers, headers, problem documents and
metrics labels are the route's. Every other form (a query string, another method) goes to
FastAPI, whose routes stay the reference and the OpenAPI document; tests/integration/
test_fastpath.py checks that both paths answer alike.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.auth.access import authorize
from app.auth.policy import ANONYMOUS, Principal
from app.errors import ErrorCode, GatewayError
from app.http import JSON
from app.kv.http import entry_headers, entry_response
from app.kv.model import Entry
from app.middleware import request_id_of
from app.problems import (
    client_gone_response,
    gateway_error_response,
    http_exception_response,
    problem_response,
)

log = logging.getLogger("jsgw.fastpath")

# What an answer gets: the request, its path parameters, the runtime, the caller, the route's
# endpoint function. It returns a Response, or None when it has sent the answer itself.
Answer = Callable[
    [Request, dict[str, str], Any, Principal, Callable[..., Any], Send], Awaitable[Response | None]
]


@dataclass(frozen=True, slots=True)
class LeanPath:
    method: str
    template: str
    pattern: re.Pattern[str]
    answer: Answer
    route: Any = None  # FastAPI's route for the template: metrics, auth and the endpoint


async def _read(request: Request, params: dict[str, str], runtime: Any, _p: Principal,
                _endpoint: Callable[..., Any], send: Send) -> Response | None:
    entry = await runtime.kv.get(params["bucket"], params["key"])
    if_none_match = accept = None  # the first of each, as Starlette's Headers.get reads them
    for name, value in request.scope["headers"]:
        if name == b"if-none-match":
            if if_none_match is None:
                if_none_match = value.decode("latin-1")
        elif name == b"accept" and accept is None:
            accept = value
    if if_none_match is None and (accept is None or b"application/json" not in accept):
        await _send_value(send, entry)  # the common answer, without building a Response
        return None
    return entry_response(entry, request.headers, if_none_match)


async def _write(request: Request, params: dict[str, str], runtime: Any, _p: Principal,
                 endpoint: Callable[..., Any], _send: Send) -> Response:
    headers = request.headers
    return await endpoint(  # type: ignore[no-any-return]
        bucket=params["bucket"], key=params["key"], request=request, kv=runtime.kv,
        pool=runtime.pool, ttl=None, if_match=headers.get("if-match"),
        if_none_match=headers.get("if-none-match"),
    )  # fmt: skip


async def _publish(request: Request, params: dict[str, str], runtime: Any,
                   principal: Principal, endpoint: Callable[..., Any], _send: Send) -> Response:
    ack = await endpoint(
        subject=params["subject"], request=request, pool=runtime.pool,
        publisher=runtime.publisher, principal=principal, streams=runtime.streams,
    )  # fmt: skip
    return JSON(ack)  # a PubAck dict: what response_model=PubAck would serialize


_KEY_PATH = re.compile(r"/v1/kv/(?P<bucket>[^/]+)/keys/(?P<key>.+)", re.DOTALL)
PATHS = (
    LeanPath("GET", "/v1/kv/{bucket}/keys/{key}", _KEY_PATH, _read),
    LeanPath("PUT", "/v1/kv/{bucket}/keys/{key}", _KEY_PATH, _write),
    LeanPath("POST", "/v1/publish/{subject}",
             re.compile(r"/v1/publish/(?P<subject>.+)", re.DOTALL), _publish),
)  # fmt: skip

_SCOPE_KEY = "jsgw.lean"


class LeanPaths:
    """The ASGI app of the lean paths (wrapped in the gateway's middleware by the caller)."""

    def __init__(self, paths: list[LeanPath]) -> None:
        self.by_method: dict[str, list[LeanPath]] = {}
        for path in paths:
            self.by_method.setdefault(path.method, []).append(path)

    def take(self, scope: Scope) -> bool:
        """Is this request one of the lean paths' (then it is marked for :meth:`__call__`)?"""
        candidates = self.by_method.get(scope["method"])
        if candidates is None or scope.get("query_string") or "runtime" not in (
            scope.get("state") or {}
        ):
            return False
        path = scope["path"]
        for lean in candidates:
            match = lean.pattern.fullmatch(path)
            if match is not None:
                scope[_SCOPE_KEY] = (lean, match.groupdict())
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lean, params = scope.pop(_SCOPE_KEY)
        route = lean.route
        scope["route"] = route
        scope["path_params"] = params
        request = Request(scope, receive)
        runtime = scope["state"]["runtime"]
        try:
            # With authentication off, authorize answers ANONYMOUS for every route.
            principal = await authorize(request) if runtime.auth.enabled else ANONYMOUS
            response = await lean.answer(request, params, runtime, principal, route.endpoint, send)
            if response is None:
                return
        except GatewayError as exc:
            response = gateway_error_response(exc, scope)
        except HTTPException as exc:
            response = http_exception_response(exc, scope)
        except ClientDisconnect:
            response = client_gone_response(scope)  # nothing was sent to NATS
        except Exception:
            # What Starlette's error middleware would do on the regular path, as a problem.
            log.exception("%s %s failed", scope["method"], scope["path"])
            error = GatewayError(ErrorCode.GATEWAY_INTERNAL, "internal error", status=500)
            response = problem_response(error, request_id_of(scope))
        await response(scope, receive, send)


async def _send_value(send: Send, entry: Entry) -> None:
    """What ``entry_response`` answers without conditions: 200, ``entry_headers`` and the raw
    bytes, without building a Response."""
    body = entry.value or b""
    headers = entry_headers(entry)
    headers += (
        (b"content-length", b"%d" % len(body)),
        (b"content-type", b"application/octet-stream"),
    )
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: Any, routes: Any) -> None:
    """Give the app the lean paths, each bound to FastAPI's route (among ``routes``) for the
    same method and template."""
    bound = []
    for lean in PATHS:
        for route in routes:
            template = getattr(route, "path_format", None)
            if template == lean.template and lean.method in getattr(route, "methods", ()):
                bound.append(LeanPath(lean.method, lean.template, lean.pattern, lean.answer, route))
                break
        else:
            raise RuntimeError(f"no {lean.method} route {lean.template} to stand in for")
    app.lean_paths = LeanPaths(bound)
