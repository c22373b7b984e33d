"""The console's files and the offline docs: served from the package, public, no CDN."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from app.main import openapi_document
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway

TOKEN = "ui-test-token-0123456789abcdef"
_REFERENCES = re.compile(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""")


def references(html: str) -> list[str]:
    """What a page loads or links to (src, href, and Swagger UI's url: '...')."""
    return _REFERENCES.findall(html)


@pytest.fixture
async def gateway_with_auth(
    nats_server: EmbeddedServer, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    path = tmp_path / "auth.yaml"
    path.write_text(
        f'tokens:\n  - name: operator\n    token: "{TOKEN}"\n'
        '    rules: [{resource: "kv:*", actions: [read]}]\n'
    )
    async with running_gateway(gateway_settings(nats_server.url, auth_file=path)) as client:
        yield client


async def test_console_files_are_public_with_auth_on(gateway_with_auth: httpx.AsyncClient) -> None:
    gw = gateway_with_auth
    problem(await gw.get("/v1/kv"), 401, "auth.required")  # the data is not public

    index = await gw.get("/ui/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert "console.js" in index.text
    for ref in references(index.text):
        if ref.startswith("#"):
            continue
        url = urljoin("http://gateway/ui/", ref)
        assert url.startswith("http://gateway/"), f"the console refers outside: {ref}"
        loaded = await gw.get(url, follow_redirects=True)
        assert loaded.status_code == 200, (ref, loaded.status_code)

    script = await gw.get("/ui/console.js")
    kind = script.headers["content-type"].split(";")[0]
    assert kind in ("text/javascript", "application/javascript")
    assert "https://" not in script.text and "http://" not in script.text
    assert (await gw.get("/ui")).headers["location"].endswith("/ui/")
    assert (await gw.get("/")).headers["location"] == "/ui/"
    problem(await gw.get("/ui/nothing.js"), 404)


async def test_docs_load_only_local_assets(gateway_with_auth: httpx.AsyncClient) -> None:
    gw = gateway_with_auth
    docs = await gw.get("/docs")
    assert docs.status_code == 200
    assert "://" not in docs.text, "no absolute URL: nothing from a CDN"
    refs = references(docs.text)
    assert "/openapi.json" in refs and "/docs/assets/swagger-ui-bundle.js" in refs, refs
    for ref in refs:
        loaded = await gw.get(ref)
        assert loaded.status_code == 200, ref
        assert len(loaded.content) > 100, ref
    bundle = await gw.get("/docs/assets/swagger-ui-bundle.js")
    assert b"SwaggerUIBundle" in bundle.content
    assert (await gw.get("/redoc")).status_code == 404  # ReDoc would load its logo from a CDN


async def test_sse_token_is_minted_for_anonymous_when_auth_is_off(
    gateway: httpx.AsyncClient,
) -> None:
    """The console always mints one before a watch, with auth on or off."""
    minted = await gateway.post("/v1/auth/sse-token")
    assert minted.status_code == 200, minted.text
    body = minted.json()["token"].split(".")[0]
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert claims["n"] == "anonymous"


def test_pages_are_not_in_the_api_spec() -> None:
    paths = openapi_document()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith(("/ui", "/docs"))]
