"""The application factory: the only module that imports the routers."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__, fastpath, problems, routing, ui
from app.accesslog import AccessLog
from app.auth.access import authorize
from app.config import Settings
from app.direct.schemas import EndOfBatchLine
from app.lifespan import make_lifespan
from app.metrics import Metrics
from app.middleware import BodyLimitMiddleware, RequestContext, RequestContextMiddleware
from app.schemas import Message, Problem
from app.serving import DIRECT_PATHS, once_started
from app.sse import RAW_SEND
from routers import (
    auth,
    consumers,
    counters,
    direct,
    kv,
    nats,
    obj,
    publish,
    streams,
    subscriptions,
    system,
)

DESCRIPTION = """HTTP/REST + SSE gateway for NATS JetStream: streams, publish, KV, Direct Get
and pull consumers for programs without a NATS client. Errors are RFC 9457 problem+json with a
stable `code`; every response carries `X-Request-ID`."""


# The domains' routers, in the order the app matches them.
ROUTERS = (
    system.router,
    auth.router,
    streams.router,
    publish.router,
    direct.router,
    kv.router,
    consumers.router,
    counters.router,
    subscriptions.router,
    obj.router,
    nats.router,
)


class Gateway(FastAPI):
    """FastAPI, with the lean paths for the hottest requests taken before Starlette's layers."""

    lean_paths: fastpath.LeanPaths | None = None
    _lean_stack: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Streams write their body chunks to the server directly (app.sse.QueueStream).
        scope[RAW_SEND] = send
        try:
            lean = self.lean_paths
            # With dependencies overridden (tests), FastAPI solves them: it alone knows how.
            if (
                lean is not None
                and scope["type"] == "http"
                and not self.dependency_overrides
                and lean.take(scope)
            ):
                scope["app"] = self
                if self._lean_stack is None:
                    self._lean_stack = self._around(lean)
                await self._lean_stack(scope, receive, send)
            else:
                await super().__call__(scope, receive, send)
        finally:
            # The server's send is bound to the object that holds this scope: left in it, the
            # two would be a reference cycle per request, freed only by the garbage collector.
            scope.pop(RAW_SEND, None)

    def _around(self, app: ASGIApp) -> ASGIApp:
        """``app`` inside the gateway's own middleware, as Starlette stacks it."""
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    access_log = AccessLog(on_drop=metrics.access_log_dropped.inc) if settings.access_log else None
    app = Gateway(
        title="jsgw",
        version=__version__,
        description=DESCRIPTION,
        lifespan=make_lifespan(settings, metrics, access_log),
        # /docs is served by app.ui from local files: FastAPI's own docs pages load their
        # scripts from a CDN (and ReDoc its logo, whatever it is told: no /redoc).
        docs_url=None,
        redoc_url=None,
        # A path no route takes is a 404 problem, also with a trailing slash: a redirect would
        # send a client with a bad name (one ending in "/", say "a%2F") elsewhere, not refuse it.
        redirect_slashes=False,
        # Every route is checked against the access rule it declares before its body is read
        # (app.routing.Route admits the request first); this returns the principal it found.
        dependencies=[Depends(authorize)],
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    for router in ROUTERS:
        app.include_router(router)
    # Static pages, not API routes: without access rules, public; their data comes through
    # the API above.
    ui.install(app)
    routing.check_declared(app)
    routing.index_paths(app, ROUTERS)
    # 405s name every method of the path, and OPTIONS is answered (app.problems).
    app.state.allowed = routing.Allowed(app)
    # Built (and checked) also when off. Served inside the middleware below: metrics,
    # request ids, CORS and limits still apply.
    lean_paths = fastpath.install(app)
    if settings.lean_paths:
        app.lean_paths = lean_paths
    problems.install(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "HEAD", "PUT", "POST", "DELETE"],
            allow_headers=["*"],
            expose_headers=[
                "ETag",
                "X-Request-ID",
                "Nats-Pin-Id",
                "KV-Revision",
                "KV-Created",
                "KV-Operation",
                "Content-Range",
            ],
        )
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body, streamed=_streamed_bodies(app))
    app.add_middleware(RequestContextMiddleware, metrics=metrics, access_log=access_log)
    if settings.lean_paths and not settings.cors_origins:
        # Served from the HTTP protocol itself, with the middleware's work (app.fastpath);
        # with CORS on, through the middleware above (CORSMiddleware has no such form).
        context = RequestContext(metrics, access_log)
        _serve_directly(app, fastpath.DirectPaths(app, lean_paths, context, settings.max_body))
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _serve_directly(app: FastAPI, direct: fastpath.DirectPaths) -> None:
    """Hand ``direct`` to the HTTP protocol (app.serving) through the lifespan state."""
    once_started(app, lambda state: {**(state or {}), DIRECT_PATHS: direct})


# The routes whose request body is streamed to NATS as it arrives, never held whole: past
# JSGW_MAX_BODY (their bound is the bucket's max_bytes, which the server enforces).
STREAMED_BODIES = (obj.put_object,)


def _streamed_bodies(app: FastAPI) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple(
        (method, mounted.path_regex)
        for mounted in routing.api_routes(app)
        if getattr(mounted.route, "endpoint", None) in STREAMED_BODIES
        for method in mounted.methods
    )


# FastAPI's OpenAPI models hold minimum/maximum as floats: 2^64-1 comes out as 2^64, 2^63-1
# as 2^63 and 10^19-1 as 10^19 (a float cannot hold them), which would let a client send one
# past the bound. These are the large bounds the models use.
_BIG_BOUNDS = {float(bound): bound for bound in (2**64 - 1, 2**63 - 1, 10**19 - 1)}
_BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_bounds(node: Any) -> None:
    """Integer bounds back as integers, the largest ones as what the models said."""
    if isinstance(node, dict):
        for keyword in _BOUND_KEYWORDS:
            value = node.get(keyword)
            if isinstance(value, float) and value.is_integer():
                node[keyword] = _BIG_BOUNDS.get(value, int(value))
        for child in node.values():
            _exact_bounds(child)
    elif isinstance(node, list):
        for child in node:
            _exact_bounds(child)


def _no_null_parameters(schema: dict[str, Any]) -> None:
    """An optional query parameter or header is left out, never null (a query string or a
    header has no null): the ``anyOf [..., null]`` of an optional Python parameter becomes
    its one other branch, so that clients send nothing rather than the text "null"."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                declared = parameter.get("schema", {})
                branches = declared.get("anyOf")
                if not branches:
                    continue
                kept = [b for b in branches if b.get("type") != "null"]
                if len(kept) == 1 and len(kept) < len(branches):
                    rest = {k: v for k, v in declared.items() if k != "anyOf"}
                    parameter["schema"] = {**kept[0], **rest}


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        schema.setdefault("components", {})["securitySchemes"] = routing.SECURITY_SCHEMES
        components = schema["components"].setdefault("schemas", {})
        # Shapes that responses refer to without a response_model (problems, NDJSON lines).
        for model in (Problem, EndOfBatchLine, Message):
            components.setdefault(model.__name__, model.model_json_schema())
        _no_null_parameters(schema)
        _exact_bounds(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def openapi_document() -> dict[str, Any]:
    """The spec, built without connecting anywhere (used by ``jsgw openapi`` and the tests)."""
    return create_app(Settings(nats_url=["nats://127.0.0.1:4222"])).openapi()
