"""A lean path for the hottest request: ``GET /v1/kv/{bucket}/keys/{key}`` (latest value).

FastAPI's routing, dependency solving and response machinery cost several times the read
itself. This handler answers the plain form of that one route directly — same service,
same authorization table, same headers and problem documents, same metrics label — and hands
everything else to FastAPI, including every variant of that route (a query string, HEAD), so
the OpenAPI document and the FastAPI route stay the reference. tests/integration/
test_fastpath.py checks that both paths answer alike.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from app.auth.access import authorize
from app.errors import GatewayError
from app.kv_http import entry_headers, entry_response
from app.middleware import request_id_of
from app.problems import problem_response
from app.services.kv_model import Entry

log = logging.getLogger("jsgw.fastpath")

TEMPLATE = "/v1/kv/{bucket}/keys/{key}"
_PATH = re.compile(r"/v1/kv/([^/]+)/keys/(.+)", re.DOTALL)


class KVReadFastPath:
    """The handler of the lean path; :class:`app.main.Gateway` sends it the requests it
    :meth:`takes`, through the gateway's own middleware (request ids, metrics, access log,
    limits, CORS) but past Starlette's and FastAPI's layers and routing."""

    def __init__(self, route: Any) -> None:
        self.route = route  # FastAPI's route for the same template: metrics and auth use it

    @staticmethod
    def takes(scope: Scope) -> bool:
        return (
            scope["method"] == "GET"
            and not scope.get("query_string")
            and scope["path"].startswith("/v1/kv/")
            and "runtime" in (scope.get("state") or {})
            and _PATH.fullmatch(scope["path"]) is not None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _PATH.fullmatch(scope["path"])
        assert match is not None
        bucket, key = match.groups()
        scope["route"] = self.route
        scope["path_params"] = {"bucket": bucket, "key": key}
        request = Request(scope, receive)
        try:
            await authorize(request)
            entry = await scope["state"]["runtime"].kv.get(bucket, key)
            headers = Headers(scope=scope)
            if_none_match = headers.get("if-none-match")
            if if_none_match is None and "application/json" not in headers.get("accept", ""):
                # The common answer, the raw value, without building a Response object.
                await _send_value(send, entry)
                return
            response = entry_response(entry, headers, if_none_match)
        except GatewayError as exc:
            response = problem_response(exc, request_id_of(scope))
        except Exception:
            # What Starlette's error middleware would do on the regular path, as a problem.
            log.exception("GET %s failed", scope["path"])
            error = GatewayError("gateway.internal", "internal error", status=500)
            response = problem_response(error, request_id_of(scope))
        await response(scope, receive, send)


async def _send_value(send: Send, entry: Entry) -> None:
    """What ``entry_response`` answers without conditions: 200 and the raw bytes."""
    body = entry.value or b""
    headers = [
        (b"content-length", str(len(body)).encode()),
        (b"content-type", b"application/octet-stream"),
        *((name.lower().encode(), value.encode()) for name, value in entry_headers(entry).items()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: Any, routes: Any) -> None:
    """Give the app the lean path for the route (among ``routes``) it stands in for."""
    for route in routes:
        if getattr(route, "path_format", None) == TEMPLATE and "GET" in getattr(route, "methods", ()):
            app.fast_path = KVReadFastPath(route)
            return
    raise RuntimeError(f"no GET route {TEMPLATE} to stand in for")
