"""A lean path for the hottest request: ``GET /v1/kv/{bucket}/keys/{key}`` (latest value).

FastAPI's routing, dependency solving and response machinery cost several times the read
itself. This ASGI layer answers the plain form of that one route directly — same service,
same authorization table, same headers and problem documents, same metrics label — and hands
everything else to FastAPI, including every variant of that route (a query string, HEAD), so
the OpenAPI document and the FastAPI route stay the reference. tests/integration/
test_fastpath.py checks that both paths answer alike.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.access import authorize
from app.errors import GatewayError
from app.kv_http import entry_response
from app.middleware import request_id_of
from app.problems import problem_response

TEMPLATE = "/v1/kv/{bucket}/keys/{key}"
_PATH = re.compile(r"/v1/kv/([^/]+)/keys/(.+)", re.DOTALL)


class KVReadFastPath:
    def __init__(self, app: ASGIApp, route: Any) -> None:
        self.app = app
        self.route = route  # FastAPI's route for the same template: metrics and auth use it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and not scope.get("query_string")
            and scope["path"].startswith("/v1/kv/")
        ):
            match = _PATH.fullmatch(scope["path"])
        runtime = (scope.get("state") or {}).get("runtime")
        if match is None or runtime is None:
            await self.app(scope, receive, send)
            return
        bucket, key = match.groups()
        scope["route"] = self.route
        scope["path_params"] = {"bucket": bucket, "key": key}
        request = Request(scope, receive)
        try:
            await authorize(request)
            entry = await runtime.kv.get(bucket, key)
            headers = Headers(scope=scope)
            response = entry_response(entry, headers, headers.get("if-none-match"))
        except GatewayError as exc:
            response = problem_response(exc, request_id_of(scope))
        await response(scope, receive, send)


def install(app: Any, routes: Any) -> None:
    """Put the lean path in front of FastAPI's router, for the route (among ``routes``) it
    stands in for."""
    for route in routes:
        if getattr(route, "path_format", None) == TEMPLATE and "GET" in getattr(route, "methods", ()):
            app.add_middleware(KVReadFastPath, route=route)
            return
    raise RuntimeError(f"no GET route {TEMPLATE} to stand in for")
