"""Every route declares its access rule, the OpenAPI document shows it, and start-up refuses an
app with an undeclared route (auth on or off)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from app.auth.access import Need
from app.config import Settings
from app.main import ROUTERS, create_app
from app.routing import (
    ACCESS_EXTENSION,
    Route,
    Router,
    api_routes,
    check_declared,
)

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
    assert route.openapi_extra == {"x-other": 1, ACCESS_EXTENSION: need.openapi()}
    with pytest.raises(TypeError):
        router.get("/{b}")  # type: ignore[call-arg]  # access= is required


def test_the_setting_leaves_the_lean_paths_checked_but_off() -> None:
    on = create_app(Settings(nats_url=URL))
    off = create_app(Settings(nats_url=URL, lean_paths=False))
    assert on.lean_paths is not None and off.lean_paths is None


def _a_path(path_format: str) -> str:
    """A path the route template matches: each parameter filled in."""
    return re.sub(r"\{[^}]+\}", "x1", path_format)


def test_each_router_s_pattern_matches_its_routes_paths_and_no_other_router_s() -> None:
    app = create_app(Settings(nats_url=URL))
    owner = {id(route): router for router in ROUTERS for route in router.routes}
    mounted = list(api_routes(app))
    assert all(router.paths is not None for router in ROUTERS)
    for m in mounted:
        path = _a_path(m.path_format)
        assert m.path_regex.match(path), m.path_format
        for router in ROUTERS:
            assert router.paths is not None
            found = router.paths[0].match(path) is not None
            if router is owner[id(m.route)]:
                assert found, (m.path_format, router.prefix)
            elif not found:  # (a pattern that does match stands aside for the route's)
                assert not any(
                    other.path_regex.match(path)
                    for other in mounted
                    if owner[id(other.route)] is router
                )


async def test_the_app_s_routing_asks_the_routers_patterns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The patterns are used by FastAPI's routing (FastAPI 0.16x matches an included router
    through its ``matches``): this fails when a FastAPI release stops asking, which would
    leave them unused. (Every route still being found with them is what the integration
    tests, which reach each route through the app, show.)"""
    asked: list[str] = []
    matches = Router.matches

    def spy(self: Router, scope: Any) -> Any:
        asked.append(self.prefix)
        return matches(self, scope)

    monkeypatch.setattr(Router, "matches", spy)
    app = create_app(Settings(nats_url=URL))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/v1/no/such/thing")
    assert answer.status_code == 404
    assert sorted(asked) == sorted(router.prefix for router in ROUTERS), (
        "FastAPI no longer asks the routers' matches: the path patterns are unused"
    )
