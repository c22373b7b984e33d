"""Rendering of errors as RFC 9457 problem+json, and the exception handlers of the app."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from app.errors import PROBLEM_CONTENT_TYPE, ErrorCode, GatewayError, InvalidInput, for_code
from app.middleware import request_id_of

log = logging.getLogger("jsgw.errors")

# No one reads this answer: nginx's "client closed request", so that metrics and the access
# log tell a client that left from a request that failed.
CLIENT_CLOSED_REQUEST = 499


def problem_response(error: GatewayError, request_id: str | None) -> Response:
    return Response(
        orjson.dumps(error.problem(request_id)),
        status_code=error.status,
        media_type=PROBLEM_CONTENT_TYPE,
        headers=error.headers,
    )


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return gateway_error_response(exc, request.scope)


def gateway_error_response(exc: GatewayError, scope: Any) -> Response:
    """A gateway error as its problem document; server-side failures (5xx) are logged."""
    if exc.status >= 500:
        log.warning("%s %s: %s %s", scope["method"], scope["path"], exc.code, exc.detail)
    return problem_response(exc, request_id_of(scope))


def _validation_detail(errors: list[Any]) -> str:
    parts = []
    for error in errors[:5]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        message = str(error.get("msg", "invalid"))
        parts.append(f"{location}: {message}" if location else message)
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


async def _request_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return validation_error_response(exc, request.scope)


def validation_error_response(exc: RequestValidationError, scope: Any) -> Response:
    """A request that failed FastAPI's validation (its parameters or body): 400, with the
    first errors."""
    errors = list(exc.errors())
    error = InvalidInput(
        ErrorCode.REQUEST_INVALID,
        _validation_detail(errors),
        extra={
            "errors": [
                {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
                for e in errors[:20]
            ]
        },
    )
    return problem_response(error, request_id_of(scope))


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        return _method_not_allowed(request, exc)
    return http_exception_response(exc, request.scope)


def _method_not_allowed(request: Request, exc: StarletteHTTPException) -> Response:
    """A path some route serves, with a method none of them takes: ``OPTIONS`` is answered
    (204 and the methods), any other method is a 405 whose Allow lists every method the path
    is served with (:class:`app.routing.Allowed`), not only those of the first route that
    matched. Both are answered before authentication (the route's handler is not reached):
    they tell nothing but the methods, which the public OpenAPI document states too."""
    allowed = getattr(request.app.state, "allowed", None)
    methods = allowed.methods(request.scope) if allowed is not None else []
    if not methods:  # not one of the app's own routes: as Starlette answered
        return http_exception_response(exc, request.scope)
    allow = ", ".join(methods)
    if request.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    error = for_code(
        ErrorCode.ROUTE_METHOD_NOT_ALLOWED,
        f"{request.method} is not a method of this resource; it takes {allow}.",
        status=405,
        headers={"Allow": allow},
    )
    return problem_response(error, request_id_of(request.scope))


_HTTP_CODES = {
    404: ErrorCode.ROUTE_NOT_FOUND,
    405: ErrorCode.ROUTE_METHOD_NOT_ALLOWED,
    413: ErrorCode.REQUEST_TOO_LARGE,
}


def http_exception_response(exc: StarletteHTTPException, scope: Any) -> Response:
    """Starlette's HTTPException (raised by the body limit, among others) as a problem."""
    if isinstance(exc.__cause__, ClientDisconnect):
        # FastAPI turns a body that ends with the connection into a 400 "error parsing the body".
        return client_gone_response(scope)
    code = _HTTP_CODES.get(exc.status_code, ErrorCode.HTTP_ERROR)
    error = for_code(
        code,
        str(exc.detail),
        status=exc.status_code,
        headers=dict(exc.headers or {}),
    )
    return problem_response(error, request_id_of(scope))


async def _client_disconnect(request: Request, exc: Exception) -> Response:
    return client_gone_response(request.scope)


def client_gone_response(scope: Any) -> Response:
    """The client closed the connection before its request body was complete: an ordinary
    event (a client timed out, was killed, changed its mind), so one line at info and an
    answer no one reads. Nothing was sent to NATS: the body is read first."""
    log.info(
        "%s %s: the client disconnected before its request body was complete",
        scope["method"],
        scope["path"],
        extra={"request_id": request_id_of(scope)},
    )
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
