"""The lean path for GET /v1/kv/{bucket}/keys/{key} answers exactly as the FastAPI route does.

A query string (here a parameter the route ignores) sends the same request through FastAPI,
so each pair below compares the two paths."""

from __future__ import annotations

from pathlib import Path

import httpx

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, running_gateway

IGNORED = {"via": "fastapi"}
SAME_HEADERS = ("content-type", "content-length", "etag", "kv-revision", "kv-operation", "kv-created",
                "www-authenticate")


def same(fast: httpx.Response, slow: httpx.Response) -> None:
    assert fast.status_code == slow.status_code, (fast.text, slow.text)
    for name in SAME_HEADERS:
        assert fast.headers.get(name) == slow.headers.get(name), name
    if fast.headers.get("content-type", "").startswith("application/problem+json"):
        a, b = fast.json(), slow.json()
        assert a.pop("instance") == fast.headers["x-request-id"]
        b.pop("instance")
        assert a == b
    else:
        assert fast.content == slow.content


async def test_both_paths_answer_alike(gateway: httpx.AsyncClient, name: str) -> None:
    assert (await gateway.put(f"/v1/kv/{name}", json={"history": 3})).status_code == 201
    await gateway.put(f"/v1/kv/{name}/keys/a.b", content=b"\x00value")
    await gateway.put(f"/v1/kv/{name}/keys/gone", content=b"x")
    await gateway.delete(f"/v1/kv/{name}/keys/gone")
    cases = [
        (f"/v1/kv/{name}/keys/a.b", {}),
        (f"/v1/kv/{name}/keys/a.b", {"Accept": "application/json"}),
        (f"/v1/kv/{name}/keys/a.b", {"If-None-Match": '"1"'}),
        (f"/v1/kv/{name}/keys/a.b", {"If-None-Match": '"7"'}),
        (f"/v1/kv/{name}/keys/gone", {}),
        (f"/v1/kv/{name}/keys/never", {}),
        (f"/v1/kv/{name}/keys/a.*", {}),
        (f"/v1/kv/{name}/keys/a%0Ab", {}),
        (f"/v1/kv/{name}/keys/.a", {}),
        ("/v1/kv/NO_SUCH_BUCKET/keys/a", {}),
        ("/v1/kv/bad.bucket/keys/a", {}),
    ]
    for path, headers in cases:
        fast = await gateway.get(path, headers=headers)
        slow = await gateway.get(path, headers=headers, params=IGNORED)
        same(fast, slow)
    metrics = (await gateway.get("/metrics")).text
    line = 'jsgw_http_requests_total{method="GET",route="/v1/kv/{bucket}/keys/{key}",status="200"}'
    assert line in metrics


async def test_both_paths_authorize_alike(nats_server: EmbeddedServer, tmp_path: Path,
                                          name: str) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        "  - {name: admin, token: admin-token-0123456789, rules: [{resource: 'kv:*', actions: [read, write, admin]}]}\n"
        f"  - {{name: app, token: app-token-0123456789ab, rules: [{{resource: 'kv:{name}/pub.', actions: [read]}}]}}\n"
    )
    async with running_gateway(gateway_settings(nats_server.url, auth_file=auth)) as gw:
        admin = {"Authorization": "Bearer admin-token-0123456789"}
        app = {"Authorization": "Bearer app-token-0123456789ab"}
        assert (await gw.put(f"/v1/kv/{name}", json={}, headers=admin)).status_code == 201
        await gw.put(f"/v1/kv/{name}/keys/pub.x", content=b"1", headers=admin)
        await gw.put(f"/v1/kv/{name}/keys/secret", content=b"2", headers=admin)
        for path, headers, status in [
            (f"/v1/kv/{name}/keys/pub.x", app, 200),
            (f"/v1/kv/{name}/keys/secret", app, 403),
            (f"/v1/kv/{name}/keys/pub.x", {}, 401),
            (f"/v1/kv/{name}/keys/pub.x", {"Authorization": "Bearer nope-nope-nope-nope"}, 401),
        ]:
            fast = await gw.get(path, headers=headers)
            slow = await gw.get(path, headers=headers, params=IGNORED)
            assert fast.status_code == status
            same(fast, slow)
