"""405 answers name every method of the resource (RFC 9110 §15.5.6), OPTIONS is answered on
every path a route serves, both before authentication, and CORS preflight is unchanged.

The reference is the committed OpenAPI document: for every path template it lists, a method
the path lacks is refused with exactly the spec's methods (and OPTIONS) in ``Allow``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from app.config import Settings
from app.main import create_app

URL = ["nats://127.0.0.1:4222"]
SPEC = json.loads((Path(__file__).parents[2] / "openapi" / "openapi.json").read_text())
HTTP_METHODS = ("GET", "HEAD", "PUT", "POST", "PATCH", "DELETE")
ORIGIN = "https://console.example"


def _auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth.yaml"
    path.write_text("tokens:\n  - {name: a, token: a-token-0123456789abcdef, rules: []}\n")
    return path


def _concrete(template: str) -> str:
    """A path the template matches: every parameter as a plain name."""
    return re.sub(r"\{[^}]+\}", "x1", template)


def _spec_methods(template: str) -> set[str]:
    return {m.upper() for m in SPEC["paths"][template] if m.upper() in HTTP_METHODS}


def _client(app: FastAPI) -> httpx.AsyncClient:
    # The app is not started (no NATS): a 405 or an OPTIONS answer never needs it.
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


@pytest.fixture(params=[False, True], ids=["auth-off", "auth-on"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> FastAPI:
    auth = _auth_file(tmp_path) if request.param else None
    return create_app(Settings(nats_url=URL, auth_file=auth))


def test_the_spec_has_paths() -> None:
    assert len(SPEC["paths"]) >= 25


async def test_every_405_lists_the_methods_of_the_spec(app: FastAPI) -> None:
    checked = 0
    async with _client(app) as gw:
        for template in SPEC["paths"]:
            served = _spec_methods(template)
            expected = served | {"OPTIONS"}
            for method in HTTP_METHODS:
                if method in served:
                    continue
                answer = await gw.request(method, _concrete(template))
                assert answer.status_code == 405, (method, template, answer.text)
                allow = [m.strip() for m in answer.headers["allow"].split(",")]
                assert sorted(allow) == sorted(expected), (method, template, allow)
                assert len(allow) == len(set(allow))
                if method != "HEAD":  # a HEAD answer has no body
                    body = answer.json()
                    assert answer.headers["content-type"].startswith("application/problem+json")
                    assert body["code"] == "route.method_not_allowed"
                    assert body["status"] == 405
                checked += 1
    assert checked >= 100


async def test_patch_on_a_bucket_names_all_its_methods(app: FastAPI) -> None:
    async with _client(app) as gw:
        answer = await gw.patch("/v1/kv/orders")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, PUT, DELETE, OPTIONS"


async def test_options_is_answered_on_every_path(app: FastAPI) -> None:
    async with _client(app) as gw:
        for template in SPEC["paths"]:
            answer = await gw.options(_concrete(template))
            assert answer.status_code == 204, (template, answer.text)
            assert answer.content == b""
            allow = {m.strip() for m in answer.headers["allow"].split(",")}
            assert allow == _spec_methods(template) | {"OPTIONS"}, template
            assert "X-Request-ID" in answer.headers
        # A key is served with HEAD: listed.
        key = await gw.options("/v1/kv/orders/keys/a/b.c")
        assert key.headers["allow"] == "GET, HEAD, PUT, DELETE, OPTIONS"
        # No route, no methods: 404 as before.
        assert (await gw.options("/v1/nothing-here")).status_code == 404


async def test_405_and_options_tell_nothing_else_without_credentials(tmp_path: Path) -> None:
    app = create_app(Settings(nats_url=URL, auth_file=_auth_file(tmp_path)))
    async with _client(app) as gw:
        # The route's handler, which authenticates, is not reached (this app has no runtime:
        # reaching it would fail). The methods are public, as in openapi.json; nothing about
        # the bucket is looked up or told.
        options = await gw.options("/v1/kv/orders")
        assert options.status_code == 204 and options.content == b""
        patch = await gw.patch("/v1/kv/orders")
        assert patch.status_code == 405
        assert set(patch.json()) <= {"type", "title", "status", "detail", "code", "instance"}
        assert "orders" not in patch.text


async def test_cors_preflight_is_still_answered_by_the_cors_layer() -> None:
    app = create_app(Settings(nats_url=URL, cors_origins=[ORIGIN]))
    async with _client(app) as gw:
        preflight = await gw.options(
            "/v1/kv",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "allow" not in preflight.headers
        other = await gw.options(
            "/v1/kv",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in other.headers
        # A plain OPTIONS from the allowed origin (not a preflight): the API's answer, with CORS.
        plain = await gw.options("/v1/kv", headers={"Origin": ORIGIN})
        assert plain.status_code == 204
        assert plain.headers["allow"] == "GET, OPTIONS"
        assert plain.headers["access-control-allow-origin"] == ORIGIN
