"""Every route declares its access rule, the OpenAPI document shows it, and start-up refuses an
app with an undeclared route (auth on or off)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import Match

from app.auth.access import AUTHENTICATED, PUBLIC, Need
from app.config import Settings
from app.main import ROUTERS, create_app
from app.routing import (
    ACCESS_EXTENSION,
    Route,
    Router,
    api_routes,
    check_declared,
    index_paths,
)
from routers import obj, system

URL = ["nats://127.0.0.1:4222"]


def _auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth.yaml"
    path.write_text("tokens:\n  - {name: a, token: a-token-0123456789abcdef, rules: []}\n")
    return path


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
def test_every_route_declares_its_access(tmp_path: Path, auth: bool) -> None:
    settings = Settings(nats_url=URL, auth_file=_auth_file(tmp_path) if auth else None)
    app = create_app(settings)
    mounted = list(api_routes(app))
    assert len(mounted) >= 38
    spec = app.openapi()["paths"]
    for m in mounted:
        assert isinstance(m.route, Route), m.path_format
        need = m.route.access
        assert isinstance(need, Need), f"{m.methods} {m.path_format} has no access rule"
        for method in m.methods:
            operation = spec[m.path_format.replace(":text", "")][method.lower()]
            assert operation[ACCESS_EXTENSION] == need.openapi()


def test_the_lean_routes_are_the_hot_ones_and_the_watch() -> None:
    app = create_app(Settings(nats_url=URL))
    lean = {
        (method, m.path_format) for m in api_routes(app) if m.route.lean for method in m.methods
    }
    assert lean == {
        ("GET", "/v1/kv/{bucket}/keys/{key}"),
        ("HEAD", "/v1/kv/{bucket}/keys/{key}"),
        ("PUT", "/v1/kv/{bucket}/keys/{key}"),
        ("DELETE", "/v1/kv/{bucket}/keys/{key}"),
        ("POST", "/v1/publish/{subject}"),
        ("POST", "/v1/counters/{stream}/{subject}"),
        ("GET", "/v1/counters/{stream}/{subject}"),
        ("GET", "/v1/kv/{bucket}/watch"),  # thousands open at once: its memory counts
        # Core NATS request/reply and publish: FastAPI's layers doubled their CPU per request.
        ("POST", "/v1/nats/request/{subject}"),
        ("POST", "/v1/nats/publish/{subject}"),
    }


def test_start_up_fails_on_a_route_without_access_rule() -> None:
    app = create_app(Settings(nats_url=URL))

    async def undeclared() -> None:
        return None

    app.add_api_route("/v1/undeclared", undeclared)  # a plain APIRoute: no rule
    with pytest.raises(RuntimeError, match="/v1/undeclared"):
        check_declared(app)
    router = Router()
    router.add_api_route("/v1/also", undeclared)  # through a Router, but not its decorators
    assert isinstance(router.routes[-1], APIRoute) and router.routes[-1].access is None


def test_a_declaration_reaches_the_route_and_its_openapi() -> None:
    router = Router(prefix="/x")
    need = Need("read")

    @router.get("/{a}", access=need, openapi_extra={"x-other": 1})
    async def endpoint(a: str) -> None:
        return None

    route = router.routes[-1]
    assert isinstance(route, Route) and route.access is need and route.lean is False
    assert route.openapi_extra == {
        "x-other": 1,
        ACCESS_EXTENSION: need.openapi(),
        "security": [{"bearerToken": []}, {"clientCertificate": []}, {}],
    }
    with pytest.raises(TypeError):
        router.get("/{b}")  # type: ignore[call-arg]  # access= is required


class _Body(BaseModel):
    a: int


def test_what_admission_may_answer_is_declared_with_the_route() -> None:
    """With authentication on, a route with a rule may answer 401, 429 and (but for one any
    principal may call) 403 before its handler runs; one with a JSON body, 413 (over
    JSGW_MAX_JSON_BODY). A public route, none of them; the route's own descriptions stay."""
    router = Router()

    @router.post("/w", access=Need("write"), responses={403: {"description": "own"}})
    async def write(body: _Body) -> None:
        return None

    @router.get("/me", access=AUTHENTICATED)
    async def me() -> None:
        return None

    @router.get("/open", access=PUBLIC)
    async def public() -> None:
        return None

    @router.get("/sse", access=Need("read", sse=True))
    async def feed() -> None:
        return None

    routes = {route.path: route for route in router.routes if isinstance(route, Route)}
    assert {401, 403, 413, 429} <= set(routes["/w"].responses)
    assert routes["/w"].responses[403] == {"description": "own"}
    assert {401, 429} <= set(routes["/me"].responses) and 403 not in routes["/me"].responses
    assert 413 not in routes["/me"].responses
    assert routes["/open"].responses == {}
    assert routes["/open"].openapi_extra is not None
    assert routes["/open"].openapi_extra["security"] == [{}]
    feed_security = (routes["/sse"].openapi_extra or {})["security"]
    assert {"sseToken": []} in feed_security and {} in feed_security


def test_the_setting_leaves_the_lean_paths_checked_but_off() -> None:
    on = create_app(Settings(nats_url=URL))
    off = create_app(Settings(nats_url=URL, lean_paths=False))
    assert on.lean_paths is not None and off.lean_paths is None


def _a_path(path_format: str) -> str:
    """A path the route template matches: each parameter filled in."""
    return re.sub(r"\{[^}]+\}", "x1", path_format)


def _matched(app: FastAPI, method: str, path: str) -> bool:
    """Does an entry of the app's routes take the request (as the app's router asks them)?"""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    return any(entry.matches(dict(scope))[0] is Match.FULL for entry in app.routes)


def test_each_router_s_pattern_matches_its_routes_paths_and_no_other_router_s() -> None:
    app = create_app(Settings(nats_url=URL))
    owner = {id(route): router for router in ROUTERS for route in router.routes}
    mounted = list(api_routes(app))
    for m in mounted:
        path = _a_path(m.path_format)
        assert m.path_regex.match(path), m.path_format
        for router in ROUTERS:
            assert router.paths is not None, router.prefix
            found = router.paths.pattern.match(path) is not None
            if router is owner[id(m.route)]:
                assert found, (m.path_format, router.prefix)
            elif not found:  # (a pattern that does match stands aside for the route's)
                assert not any(
                    other.path_regex.match(path)
                    for other in mounted
                    if owner[id(other.route)] is router
                )
        assert all(_matched(app, method, path) for method in m.methods), m.path_format


async def test_the_app_s_routing_walks_only_the_router_whose_pattern_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FastAPI (0.16x) asks each included router through its ``matches``, and walks its
    routes in ``APIRouter.matches``: with the patterns, only the router that has the path is
    walked. This fails when a FastAPI release stops asking (the patterns unused)."""
    asked: list[str] = []
    walked: list[str] = []
    ours, fastapis = Router.matches, APIRouter.matches

    def ask(self: Router, scope: Any) -> Any:
        asked.append(self.prefix)
        return ours(self, scope)

    def walk(self: APIRouter, scope: Any) -> Any:
        walked.append(self.prefix)
        return fastapis(self, scope)

    monkeypatch.setattr(Router, "matches", ask)
    monkeypatch.setattr(APIRouter, "matches", walk)
    app = create_app(Settings(nats_url=URL))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/v1/no/such/thing")
    assert answer.status_code == 404
    assert sorted(asked) == sorted(router.prefix for router in ROUTERS), (
        "FastAPI no longer asks the routers' matches: the path patterns are unused"
    )
    assert walked == []
    asked.clear()
    assert _matched(app, "GET", "/v1/obj/b/objects/x")
    assert walked == ["/v1/obj"] and len(asked) == ROUTERS.index(obj.router) + 1


def test_a_pattern_holds_for_its_own_inclusion_and_routes_only() -> None:
    first = create_app(Settings(nats_url=URL))
    # The same router included elsewhere, under a prefix: matched by FastAPI alone there.
    other = FastAPI()
    other.include_router(system.router, prefix="/gw")
    assert _matched(other, "GET", "/gw/healthz")
    # A second app indexes the shared routers again: the first is matched as without them.
    second = create_app(Settings(nats_url=URL))
    for app in (first, second):
        assert _matched(app, "GET", "/v1/kv/b/keys/k") and _matched(app, "GET", "/healthz")
    # A route added to a router after its pattern was made: the pattern is not used.
    late = Router(prefix="/v1/late")

    @late.get("/one", access=Need("read"))
    async def one() -> dict[str, int]:
        return {"one": 1}

    app = FastAPI()
    app.include_router(late)
    index_paths(app, [late])
    assert late.paths is not None and not _matched(app, "GET", "/v1/late/two")

    @late.get("/two", access=Need("read"))
    async def two() -> dict[str, int]:
        return {"two": 2}

    assert late.paths.pattern.match("/v1/late/two") is None
    assert _matched(app, "GET", "/v1/late/two")
