"""Lean paths for the hottest requests and the longest-lived ones: the routes declared
``lean=True`` (today ``GET``, ``HEAD``, ``PUT`` and ``DELETE /v1/kv/{bucket}/keys/{key}``,
``POST /v1/publish/{subject}``, ``POST`` and ``GET /v1/counters/{stream}/{subject}``, core NATS
``POST /v1/nats/request/{subject}`` and ``/v1/nats/publish/{subject}``, and the KV watch
``GET /v1/kv/{bucket}/watch``).

FastAPI's routing, dependency solving and response machinery cost several times the work of
the short requests, and an open stream holds all of it for as long as it lasts (coroutine
frames through Starlette's and FastAPI's middleware and routing, three exit stacks: about
9 KB of each KV watcher's memory). Served by the gateway's HTTP protocol, these requests are
answered from it (:class:`DirectPaths`: no ASGI layers, the middleware's work done by the
same functions); otherwise (CORS on, another server, the tests' in-process client)
:class:`app.main.Gateway` hands the requests these paths :meth:`LeanPaths.take` to them,
inside the gateway's own middleware (request ids, metrics, access log, limits, CORS) but past
Starlette's and FastAPI's layers. Only the dispatch shell
differs: a lean path matches the route's own compiled pattern, authorizes by the route's
declared rule, and calls the route's own endpoint with the arguments FastAPI would pass,
derived at start-up from the route's ``dependant`` (:class:`Arguments`): path parameters from
the match, headers by their alias, query parameters validated by FastAPI's own
``request_params_to_args`` against the route's declared fields (at their defaults, with no
validation to do, when there is no query string), ``Request``, the principal, and the
runtime's services for the providers :data:`app.deps.FROM_RUNTIME` names. A query that fails
validation gets the same ``request.invalid`` problem as on FastAPI's route. Whatever else an
endpoint asks for (a body model, a required query parameter, a validated header, another
dependency) fails start-up (:class:`LeanPathError`), so a parameter added to a lean route
either reaches its lean path or stops the gateway from starting. The endpoint builds its
Response itself, so answers, headers, problem documents and metrics labels are the route's.
Other methods go to FastAPI, whose routes stay the reference and the OpenAPI document;
``JSGW_LEAN_PATHS=false`` sends everything there, and tests/integration/test_fastpath.py
checks that both paths answer alike. ``request_params_to_args`` is FastAPI's
(``fastapi.dependencies.utils``), the function its dependency solving validates query
parameters with; tests/unit/test_lean_arguments.py fails if it moves.
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
import time
import typing
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.utils import request_params_to_args
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.convertors import Convertor
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.auth.access import admit, authorize
from app.auth.policy import ANONYMOUS, Principal
from app.deps import FROM_RUNTIME
from app.errors import ErrorCode, GatewayError
from app.middleware import (
    REQUEST_ID_HEADER,
    AddedHeaders,
    Framing,
    RequestContext,
    body_framing,
    request_id_of,
    without_second_connection,
)
from app.problems import (
    client_gone_response,
    gateway_error_response,
    http_exception_response,
    problem_response,
    validation_error_response,
)
from app.routing import api_routes
from app.sse import RAW_SEND

log = logging.getLogger("jsgw.fastpath")


class LeanPathError(RuntimeError):
    """A lean route whose endpoint the lean path cannot call exactly as FastAPI would."""


_PLAIN_TEXT = (str, str | None)  # Optional[str] compares equal to str | None
_IMMUTABLE = (type(None), str, bytes, int, float, bool)


@dataclass(frozen=True, slots=True)
class Arguments:
    """How to build an endpoint's keyword arguments from a lean request, as FastAPI's
    dependency solving would."""

    fixed: dict[str, Any]  # query parameters at their defaults (no query string)
    query: tuple[Any, ...]  # the route's query parameters (FastAPI's ModelFields)
    headers: dict[bytes, str]  # lower-case header name -> parameter
    header_defaults: dict[str, Any]
    request: str | None  # the parameter that takes the Request
    principal: str | None  # the parameter that takes authorize's answer
    services: tuple[tuple[str, str | None], ...]  # parameter, runtime attribute (None: it)

    def build(
        self, request: Request, params: dict[str, Any], runtime: Any, principal: Principal
    ) -> dict[str, Any]:
        """The keyword arguments; :class:`RequestValidationError` for a query that does not
        validate."""
        kwargs = {**self.fixed, **params}
        if self.query and request.scope["query_string"]:
            values, errors = request_params_to_args(self.query, request.query_params)
            if errors:
                raise RequestValidationError(errors)
            kwargs.update(values)
        wanted = self.headers
        if wanted:
            found = dict(self.header_defaults)
            seen: set[str] = set()
            for name, value in request.scope["headers"]:
                param = wanted.get(name)
                if param is not None and param not in seen:  # the first, as Headers.get reads
                    seen.add(param)
                    found[param] = value.decode("latin-1")
            kwargs.update(found)
        if self.request is not None:
            kwargs[self.request] = request
        if self.principal is not None:
            kwargs[self.principal] = principal
        for name, attribute in self.services:
            kwargs[name] = runtime if attribute is None else getattr(runtime, attribute)
        return kwargs


def _plain(field: Any) -> bool:
    """A str parameter FastAPI hands over as received (no constraint, alias choice, ...)."""
    info = field.field_info
    return (
        info.annotation in _PLAIN_TEXT
        and not info.metadata
        and info.validation_alias is None
        and not getattr(info, "validate_default", False)
    )


def _default(field: Any, where: str) -> Any:
    info = field.field_info
    if info.is_required():
        raise LeanPathError(f"{where}: parameter {field.name!r} is required")
    if not isinstance(field.default, _IMMUTABLE) or info.validate_default:
        raise LeanPathError(f"{where}: parameter {field.name!r} has a default FastAPI copies")
    return copy.deepcopy(field.default)


def arguments(route: APIRoute, where: str) -> Arguments:
    """The plan for ``route``'s endpoint, or :class:`LeanPathError` when its plain form would
    get from FastAPI anything the lean path cannot give it alike."""
    d = route.dependant
    if not inspect.iscoroutinefunction(d.call):
        raise LeanPathError(f"{where}: the endpoint is not a coroutine function")
    hints = typing.get_type_hints(d.call)
    returns = hints.get("return")
    if not (inspect.isclass(returns) and issubclass(returns, Response)):
        raise LeanPathError(f"{where}: the endpoint must build its Response (-> Response)")
    unsupported = [
        name
        for name, present in (
            ("cookie parameters", d.cookie_params),
            ("a body", d.body_params),
            ("a WebSocket", d.websocket_param_name),
            ("an HTTPConnection", d.http_connection_param_name),
            ("a Response to add to", d.response_param_name),
            ("BackgroundTasks", d.background_tasks_param_name),
            ("SecurityScopes", d.security_scopes_param_name),
        )
        if present
    ]
    if unsupported:
        raise LeanPathError(f"{where}: the endpoint takes {', '.join(unsupported)}")
    for field in d.path_params:
        if not _plain(field):
            raise LeanPathError(f"{where}: path parameter {field.name!r} is not plain text")
    if {f.name for f in d.path_params} != set(route.param_convertors):
        raise LeanPathError(f"{where}: the path's parameters are not the endpoint's")
    fixed = {field.name: _default(field, where) for field in d.query_params}
    headers: dict[bytes, str] = {}
    header_defaults: dict[str, Any] = {}
    for field in d.header_params:
        if not _plain(field):
            raise LeanPathError(f"{where}: header {field.alias!r} is not plain text")
        header_defaults[field.name] = _default(field, where)
        headers[field.alias.lower().encode("latin-1")] = field.name
    principal = None
    services: list[tuple[str, str | None]] = []
    for sub in d.dependencies:
        if sub.name is None:
            raise LeanPathError(f"{where}: a dependency without a parameter ({sub.call})")
        if sub.call is authorize:
            principal = sub.name
        elif sub.call in FROM_RUNTIME:
            services.append((sub.name, FROM_RUNTIME[sub.call]))
        else:
            raise LeanPathError(f"{where}: no lean provider for dependency {sub.call!r}")
    return Arguments(
        fixed,
        tuple(d.query_params),
        headers,
        header_defaults,
        d.request_param_name,
        principal,
        tuple(services),
    )


@dataclass(frozen=True, slots=True)
class LeanPath:
    method: str
    route: APIRoute  # FastAPI's route: its endpoint, access rule and metrics label
    pattern: re.Pattern[str]
    convertors: tuple[tuple[str, Convertor[Any]], ...]
    arguments: Arguments
    whole: bool  # its answers are written whole (its response class is no stream)


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
        if candidates is None or "runtime" not in (scope.get("state") or {}):
            return False
        path = scope["path"]
        for lean in candidates:
            match = lean.pattern.match(path)
            if match is not None:
                params = match.groupdict()
                for name, convertor in lean.convertors:
                    params[name] = convertor.convert(params[name])
                scope[_SCOPE_KEY] = (lean, params)
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # (The response is built in a call of its own: what building it took is not held by
        # this frame while a long response, a KV watch's, is sent.)
        response = await self._respond(scope, receive)
        await response(scope, receive, send)

    @staticmethod
    async def _respond(scope: Scope, receive: Receive) -> Response:
        lean, params = scope.pop(_SCOPE_KEY)
        route = lean.route
        scope["route"] = route
        scope["path_params"] = params
        request = Request(scope, receive)
        runtime = scope["state"]["runtime"]
        try:
            # Before anything reads the body (the endpoint does). With authentication off,
            # every route is open to ANONYMOUS.
            principal = await admit(request) if runtime.auth.enabled else ANONYMOUS
            kwargs = lean.arguments.build(request, params, runtime, principal)
            response: Response = await route.endpoint(**kwargs)
            return response
        except GatewayError as exc:
            return gateway_error_response(exc, scope)
        except RequestValidationError as exc:
            return validation_error_response(exc, scope)
        except HTTPException as exc:
            return http_exception_response(exc, scope)
        except ClientDisconnect:
            return client_gone_response(scope)  # nothing was sent to NATS
        except Exception:
            # What Starlette's error middleware would do on the regular path, as a problem.
            log.exception("%s %s failed", scope["method"], scope["path"])
            error = GatewayError(ErrorCode.GATEWAY_INTERNAL, "internal error", status=500)
            return problem_response(error, request_id_of(scope))


def install(app: FastAPI) -> LeanPaths:
    """The lean paths of the app's routes declared ``lean``, each matching the route's own
    compiled pattern; raises :class:`LeanPathError` for one that cannot be served alike."""
    paths = []
    for mounted in api_routes(app):
        route = mounted.route
        if not getattr(route, "lean", False):
            continue
        where = f"{' '.join(sorted(mounted.methods))} {mounted.path_format}"
        plan = arguments(route, where)
        convertors = tuple(mounted.param_convertors.items())
        response_class = route.response_class
        if isinstance(response_class, DefaultPlaceholder):
            response_class = response_class.value
        # (What DirectPaths.serve writes whole: a Response that its own __call__ sends.)
        whole = response_class.__call__ is Response.__call__
        for method in sorted(mounted.methods):
            paths.append(LeanPath(method, route, mounted.path_regex, convertors, plan, whole))
    return LeanPaths(paths)


class DirectPaths:
    """The lean paths served straight from the HTTP protocol (app.serving.GatheringProtocol),
    without the ASGI layers: the protocol hands over each parsed request (uvicorn's
    ``RequestResponseCycle``: its scope, body and connection state) that :meth:`take` accepts,
    and :meth:`serve` does in one coroutine what the gateway's middleware and
    :class:`LeanPaths` do for it (:class:`app.middleware.RequestContext`: request id, header
    checks, metrics, access line; the body bound; the route's endpoint), then writes a whole
    answer, head and body, in one write, as uvicorn's ``send`` would have written it (its
    status lines, its default headers, its header checks, ``connection: close`` when the
    connection is not kept).

    A request that one read holds whole is answered through app.serving's ``WholeCycle``
    instead of uvicorn's cycle (``take(scope, whole=True)``: only routes whose answers are
    written whole; see app.serving).

    Taken: a lean route's request with no body, or a body of a declared length within
    ``JSGW_MAX_BODY`` (llhttp delivers no more than declared). A body of another framing
    (chunked, over the bound) goes to the ASGI path, whose middleware counts or refuses it;
    so do all requests with CORS on (``JSGW_CORS_ORIGINS``), or with dependency overrides
    (tests). Streamed answers (a KV watch) are sent through the cycle's ``send``.
    """

    _TAKEN = (Framing.NONE, Framing.EMPTY, Framing.DECLARED)

    def __init__(
        self, app: FastAPI, lean: LeanPaths, context: RequestContext, max_body: int
    ) -> None:
        from app.compat import uvicorn_wire  # (the HTTP server's names: loaded with it)

        self.app = app
        self.lean = lean
        self.context = context
        self.max_body = max_body
        self._status_lines, self._bad_name, self._bad_value = uvicorn_wire()
        # uvicorn's default headers (server, date: a new list each second) as written, once
        # per list: (the list, its lines, has a connection header, one saying close).
        self._defaults: tuple[Any, bytes, bool, bool] = (None, b"", False, False)

    def take(self, scope: Scope, *, whole: bool = False) -> bool:
        """Is this request the lean paths' (``whole``: and is its answer written whole)?"""
        return (
            not self.app.dependency_overrides
            and self.lean.take(scope)
            and body_framing(scope, self.max_body) in self._TAKEN
            and (not whole or scope[_SCOPE_KEY][0].whole)
        )

    async def serve(self, cycle: Any) -> None:
        """Answer the request of uvicorn's ``cycle`` (a task of its own, as uvicorn's)."""
        scope = cycle.scope
        started = time.perf_counter()
        request_id, refusal = self.context.begin(scope)
        status = 500
        scope["app"] = self.app
        scope[RAW_SEND] = cycle.send
        try:
            if refusal is not None:
                scope.pop(_SCOPE_KEY)
                response = problem_response(refusal, request_id)
            else:
                response = await LeanPaths._respond(scope, cycle.receive)
            extra = [(REQUEST_ID_HEADER, request_id.encode())]
            if cycle.more_body:
                # Answered before its body came whole: what is left is not read (as
                # app.middleware.BodyLimitMiddleware closes such a connection).
                extra.append((b"connection", b"close"))
            if (
                isinstance(response, Response)
                and type(response).__call__ is Response.__call__
                and response.background is None
            ):
                status = response.status_code
                await self._write_whole(cycle, response, extra)
            else:  # a stream (a KV watch): through the cycle's send
                send = AddedHeaders(cycle.send, extra)
                await response(scope, cycle.receive, send)
                status = send.status
                if not cycle.response_complete and not cycle.disconnected:
                    cycle.transport.close()  # (as uvicorn ends an answer left incomplete)
        except BaseException as exc:
            log.error("%s %s failed", scope["method"], scope["path"], exc_info=exc)
            status = 500
            if not cycle.response_started:
                await cycle.send_500_response()
            else:
                cycle.transport.close()
        finally:
            scope.pop(RAW_SEND, None)
            cycle.on_response = _nothing  # (as run_asgi leaves it: no cycle through it)
            self.context.end(scope, request_id, status, started)

    async def _write_whole(
        self, cycle: Any, response: Response, extra: list[tuple[bytes, bytes]]
    ) -> None:
        """What uvicorn's ``send`` writes for the start and the one body message, at once,
        with the ``extra`` headers (as :class:`app.middleware.AddedHeaders` adds them)."""
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        keep_alive = cycle.keep_alive
        if self._defaults[0] is not cycle.default_headers:
            self._defaults = (cycle.default_headers, *self._head_lines(cycle.default_headers))
        _, default_lines, connection, close = self._defaults
        headers = response.raw_headers
        lines, own_connection, own_close = self._head_lines(
            (*headers, *without_second_connection(headers, extra))
        )
        connection |= own_connection  # a connection header is written
        if close or own_close:
            keep_alive = cycle.keep_alive = False
        head: list[bytes | memoryview] = [
            self._status_lines[response.status_code],
            default_lines,
            lines,
        ]
        # (Started only now: a refused header leaves the 500 to send, where uvicorn's send
        # has started and can only close.)
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        if not keep_alive and not connection:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if cycle.scope["method"] != "HEAD":
            head.append(response.body)
        transport = cycle.transport
        getattr(transport, "write_whole", transport.write)(b"".join(head))
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            transport.close()
        cycle.on_response()

    def _head_lines(self, headers: Any) -> tuple[bytes, bool, bool]:
        """The header lines uvicorn's ``send`` writes for ``headers`` (names lower-cased,
        refused as it refuses them); whether one is ``connection``, and one says close."""
        parts: list[bytes] = []
        connection = close = False
        for name, value in headers:
            name = name.lower()
            if name == b"connection":
                connection = True
                close = close or b"close" in value.lower()
            parts += (name, b": ", value, b"\r\n")
        # uvicorn's checks, one search over all names and one over all values: its patterns
        # are each one character class (app.compat checks), which no joining can fool.
        if self._bad_name.search(b"".join(parts[0::4])):
            raise RuntimeError("Invalid HTTP header name.")
        if self._bad_value.search(b"".join(parts[2::4])):
            raise RuntimeError("Invalid HTTP header value.")
        return b"".join(parts), connection, close


def _nothing() -> None:
    pass
