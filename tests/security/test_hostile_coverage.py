"""Every API route that takes input gets hostile requests: a route added without cases in
tests/security/hostile_cases.py fails here (no server needed)."""

from __future__ import annotations

from urllib.parse import unquote

from fastapi.dependencies.models import Dependant

from app.config import Settings
from app.main import create_app
from app.routing import api_routes
from tests.security import hostile_cases as hc


def _takes_input(d: Dependant) -> bool:
    own = d.path_params or d.query_params or d.header_params or d.body_params
    return bool(own) or any(_takes_input(sub) for sub in d.dependencies)


def test_every_route_that_takes_input_has_hostile_cases() -> None:
    app = create_app(Settings(nats_url=["nats://127.0.0.1:4222"]))
    cases = [(c.method, unquote(c.path.split("?")[0], errors="replace")) for c in hc.all_cases()]
    uncovered = []
    checked = 0
    for mounted in api_routes(app):
        if not _takes_input(mounted.route.dependant):
            continue
        for method in mounted.methods:
            checked += 1
            if not any(m == method and mounted.path_regex.match(p) for m, p in cases):
                uncovered.append(f"{method} {mounted.path_format}")
    assert checked >= 30
    assert not uncovered, f"routes without hostile cases: {uncovered}"
