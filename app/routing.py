"""Routes that say what they are: the access rule they need and whether they have a lean path.

A route is declared once, at its decorator::

    @router.get("/{bucket}/keys/{key:text}", access=Need("read", KEY), lean=True, ...)

:class:`Router`'s decorators take ``access`` (required) and ``lean`` and attach them to the
endpoint; :class:`Route` reads them back when FastAPI builds the route (also the copies an
``include_router`` makes), keeps them on the route object and adds the rule to the
operation's OpenAPI (``x-jsgw-access``). Everything else is derived from the route:
:func:`app.auth.access.authorize` reads ``route.access`` from the matched route, and
:mod:`app.fastpath` builds the lean dispatch from the routes marked ``lean`` and their
compiled path patterns. :func:`check_declared` fails start-up when an API route has no rule.

A route's handler admits the request (:func:`app.auth.access.admit`: authentication and the
access decision, from the head alone) before FastAPI reads or decodes anything of its body,
so that a refused request costs the reading of its head; a route that takes a JSON body then
reads it within ``JSGW_MAX_JSON_BODY`` (:func:`app.middleware.read_json_body`) before FastAPI
decodes and validates it. Routes that read their raw body themselves keep ``JSGW_MAX_BODY``,
but for those that stream it to NATS as it arrives (``app.main.STREAMED_BODIES``).

A :class:`Router` also answers FastAPI's routing at once for paths none of its routes has
(:func:`index_paths`), so that a request is not tried against every route of the routers
included before the one that serves it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import fastapi.routing
import starlette.routing
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette._utils import get_route_path  # the path Starlette's router matches
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from app import errors
from app.auth.access import Need, admit
from app.auth.guard import SSE_COOKIE, SSE_QUERY
from app.http import problems
from app.middleware import read_json_body

_DECLARED = "__jsgw_route__"
ACCESS_EXTENSION = "x-jsgw-access"

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Declared:
    access: Need
    lean: bool = False


class Route(APIRoute):
    """An API route carrying its declaration: ``access`` (None: undeclared, refused) and
    ``lean``."""

    access: Need | None
    lean: bool

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        declared: Declared | None = getattr(endpoint, _DECLARED, None)
        self.access = declared.access if declared else None
        self.lean = declared.lean if declared else False
        if self.access is not None:
            kwargs["openapi_extra"] = {
                **(kwargs.get("openapi_extra") or {}),
                ACCESS_EXTENSION: self.access.openapi(),
                **_security(self.access),
            }
        super().__init__(path, endpoint, **kwargs)
        if self.access is not None:
            # What admitting the request may answer, whatever the handler does; the route's
            # own declarations (descriptions of the same statuses) come first.
            self.responses = {
                **_admission(self.access, self.body_field is not None),
                **self.responses,
            }

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_json = self.body_field is not None  # a body model: FastAPI decodes it as JSON

        async def admitted(request: Request) -> Response:
            await admit(request)
            if takes_json:
                request = await read_json_body(request)
            return await handler(request)

        return admitted


# The security schemes of the OpenAPI document (app.main adds them to its components): a
# bearer token, the short-lived SSE token of the routes that take one (``access_token`` query
# parameter, or the cookie POST /v1/auth/sse-token sets), and a TLS client certificate.
SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "bearerToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "A token of the gateway's auth file (JSGW_AUTH_FILE). Without an auth "
        "file, authentication is off and no credential is needed.",
    },
    "sseToken": {
        "type": "apiKey",
        "in": "query",
        "name": SSE_QUERY,
        "description": "A short-lived token from POST /v1/auth/sse-token, for an EventSource "
        f"(which cannot send headers); also taken from the {SSE_COOKIE} cookie.",
    },
    "clientCertificate": {
        "type": "mutualTLS",
        "description": "A TLS client certificate whose name the auth file maps to a principal.",
    },
}


def _security(access: Need) -> dict[str, Any]:
    """The operation's ``security``: any one of the schemes, or none (authentication off)."""
    if access.action == "public":
        return {"security": [{}]}
    schemes = ["bearerToken", "clientCertificate"] + (["sseToken"] if access.sse else [])
    return {"security": [*({scheme: []} for scheme in schemes), {}]}


def _admission(access: Need, takes_json: bool) -> dict[int | str, dict[str, Any]]:
    """The statuses admitting a request may answer before its handler runs: with
    authentication on, 401 (no or a bad credential), 429 (the token's rate limit) and, but
    for routes any principal may call, 403; a JSON body over ``JSGW_MAX_JSON_BODY``, 413."""
    refusals: list[type[errors.GatewayError]] = []
    if access.action != "public":
        refusals += [errors.Unauthorized, errors.TooManyRequests]
        if access.action != "authenticated":
            refusals.append(errors.Forbidden)
    if takes_json:
        refusals.append(errors.PayloadTooLarge)
    return problems(*refusals) if refusals else {}


def _declare(
    access: Need, lean: bool, register: Callable[[Endpoint], Endpoint]
) -> Callable[[Endpoint], Endpoint]:
    declared = Declared(access, lean)

    def decorator(endpoint: Endpoint) -> Endpoint:
        previous = getattr(endpoint, _DECLARED, None)
        if previous is not None and previous != declared:
            raise RuntimeError(f"{endpoint.__qualname__} is declared twice, differently")
        setattr(endpoint, _DECLARED, declared)
        return register(endpoint)

    return decorator


class Router(APIRouter):
    """An ``APIRouter`` of :class:`Route` whose decorators take the route's declaration.

    Its decorators narrow APIRouter's on purpose (``access`` is required), hence the
    ``override`` ignores: a route cannot be declared here without its rule.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(route_class=Route, generate_unique_id_function=operation_id, **kwargs)
        self.paths: Paths | None = None  # (index_paths)

    def matches(self, scope: Scope) -> tuple[starlette.routing.Match, Scope]:
        """FastAPI's answer, or at once "no match" when no route of this router has the
        request's path (see :func:`index_paths`)."""
        paths = self.paths
        if (
            paths is not None
            and getattr(self, "_routes_version", None) == paths.version
            and scope.get(_FASTAPI_SCOPE, {}).get(_INCLUDED_ROUTER) is paths.included
            and paths.pattern.match(get_route_path(scope)) is None
        ):
            return starlette.routing.Match.NONE, {}
        return super().matches(scope)

    def get(  # type: ignore[override]
        self, path: str, *, access: Need, lean: bool = False, **kwargs: Any
    ) -> Callable[[Endpoint], Endpoint]:
        return _declare(access, lean, super().get(path, **kwargs))

    def head(  # type: ignore[override]
        self, path: str, *, access: Need, lean: bool = False, **kwargs: Any
    ) -> Callable[[Endpoint], Endpoint]:
        return _declare(access, lean, super().head(path, **kwargs))

    def put(  # type: ignore[override]
        self, path: str, *, access: Need, lean: bool = False, **kwargs: Any
    ) -> Callable[[Endpoint], Endpoint]:
        return _declare(access, lean, super().put(path, **kwargs))

    def post(  # type: ignore[override]
        self, path: str, *, access: Need, lean: bool = False, **kwargs: Any
    ) -> Callable[[Endpoint], Endpoint]:
        return _declare(access, lean, super().post(path, **kwargs))

    def delete(  # type: ignore[override]
        self, path: str, *, access: Need, lean: bool = False, **kwargs: Any
    ) -> Callable[[Endpoint], Endpoint]:
        return _declare(access, lean, super().delete(path, **kwargs))


def operation_id(route: APIRoute) -> str:
    """An operation's ``operationId`` is its endpoint's name (``put_key``), unique across the
    app (tests/contract/test_openapi.py): clients generated from the spec name their
    functions after it, where FastAPI's default would add the path and method
    (``put_key_v1_kv__bucket__keys__key__put``)."""
    return route.name


@dataclass(frozen=True, slots=True)
class Mounted:
    """An API route and where the app serves it (its pattern once included)."""

    route: APIRoute
    path_regex: re.Pattern[str]
    path_format: str
    param_convertors: dict[str, Any]
    methods: frozenset[str]


def api_routes(app: FastAPI) -> Iterator[Mounted]:
    """The app's API routes, in the order it matches them."""
    # FastAPI >= 0.16x keeps an included router as one entry and resolves its routes in
    # context (iter_route_contexts); earlier versions copy them into app.routes.
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is None:
        for route in app.routes:
            if isinstance(route, APIRoute):
                yield Mounted(
                    route,
                    route.path_regex,
                    route.path_format,
                    route.param_convertors,
                    frozenset(route.methods or ()),
                )
        return
    for context in contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            yield Mounted(
                route,
                context.path_regex,
                context.path_format,
                context.param_convertors,
                frozenset(context.methods or ()),
            )


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")
# Where FastAPI (0.16x) keeps, in a request's scope, the inclusion of a router being matched.
_FASTAPI_SCOPE: str = getattr(fastapi.routing, "_FASTAPI_SCOPE_KEY", "")
_INCLUDED_ROUTER: str = getattr(fastapi.routing, "_FASTAPI_INCLUDED_ROUTER_KEY", "")


@dataclass(frozen=True, slots=True)
class Paths:
    """One pattern of a router's paths where one inclusion of it serves them."""

    pattern: re.Pattern[str]
    included: object  # FastAPI's entry of the app's routes that includes the router
    version: int  # the router's routes version then (a route added since: not used)


def index_paths(app: FastAPI, routers: Iterable[Router]) -> None:
    """Give each router one pattern that matches the paths of all its routes, as the app
    serves them.

    FastAPI (0.16x) keeps an included router as one entry of the app's routes and matches a
    request against it by trying each of its routes in turn, with a few function calls of
    bookkeeping around each (about 2 µs a route): a request for the last router's paths went
    through every route of the routers before it (about 90 µs to find an object's route, 60
    for an ack's). With the pattern, :meth:`Router.matches` answers "no match" in one
    regular-expression match when none of the router's paths is the request's.

    The pattern holds for one inclusion (the entry of the app's routes that includes the
    router, checked on each request, as FastAPI's own ``APIRouter.matches`` checks it) and the
    routes the router had then. A router included other than once at the top of the app, with
    a route mounted twice or one that is not an API route, or on a FastAPI that does not
    include routers so, gets no pattern and is matched by FastAPI alone. Starlette's path
    patterns name their groups (``(?P<bucket>...)``), and a name may appear once in a
    pattern: the joined one keeps the groups, unnamed."""
    mounted: dict[int, list[re.Pattern[str]]] = {}
    for m in api_routes(app):
        mounted.setdefault(id(m.route), []).append(m.path_regex)
    for router in routers:
        router.paths = None
        version = getattr(router, "_routes_version", None)
        entries = [e for e in app.routes if getattr(e, "original_router", None) is router]
        patterns = [mounted.get(id(route), []) for route in router.routes]
        if (
            not (_FASTAPI_SCOPE and _INCLUDED_ROUTER)
            or version is None
            or len(entries) != 1
            or not patterns
            or any(len(found) != 1 or found[0].flags != re.UNICODE for found in patterns)
        ):
            continue
        joined = "|".join(f"(?:{_NAMED_GROUP.sub('(?:', p.pattern)})" for [p] in patterns)
        router.paths = Paths(re.compile(joined), entries[0], version)


def check_declared(app: FastAPI) -> None:
    """Start-up check: every API route declares its access rule (auth on or off)."""
    missing = [
        f"{' '.join(sorted(m.methods))} {m.path_format}"
        for m in api_routes(app)
        if getattr(m.route, "access", None) is None
    ]
    if missing:
        raise RuntimeError(
            "routes without an access rule (declare access= at the route): " + ", ".join(missing)
        )


# The order methods are listed in an Allow header (RFC 9110 §10.2.1 sets none: a stable one).
_METHOD_ORDER = ("GET", "HEAD", "PUT", "POST", "PATCH", "DELETE", "OPTIONS")


def _method_key(method: str) -> tuple[int, str]:
    try:
        return (_METHOD_ORDER.index(method), method)
    except ValueError:
        return (len(_METHOD_ORDER), method)


class Allowed:
    """The methods each path is served with, over every route whose pattern matches it.

    Starlette's router answers 405 from the first route whose path matches and names that
    route's methods only; a resource declared as several routes (one per method) takes the
    union (RFC 9110 §15.5.6: the Allow header of a 405 lists *the* methods the target resource
    supports). ``OPTIONS`` is answered for every path a route matches, so it is listed too.
    Built once at start-up from the app's routes (the API's and the plain ones, such as
    ``/openapi.json``); mounted applications (static files) answer for themselves.
    """

    def __init__(self, app: FastAPI) -> None:
        entries: list[tuple[re.Pattern[str], frozenset[str]]] = [
            (m.path_regex, m.methods) for m in api_routes(app) if m.methods
        ]
        for route in app.routes:
            if (
                isinstance(route, starlette.routing.Route)
                and not isinstance(route, APIRoute)
                and route.methods
            ):
                entries.append((route.path_regex, frozenset(route.methods)))
        self._entries = tuple(entries)

    def methods(self, scope: Scope) -> list[str]:
        """The methods served at the request's path, in Allow order (empty: no route)."""
        path = get_route_path(scope)
        found: set[str] = set()
        for pattern, methods in self._entries:
            if pattern.match(path):
                found |= methods
        if found:
            found.add("OPTIONS")
        return sorted(found, key=_method_key)
