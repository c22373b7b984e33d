"""Request bodies are capped before they are buffered."""

from __future__ import annotations

import nats

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway


async def test_body_limit(nats_server: EmbeddedServer, nc: nats.NATS, name: str) -> None:
    settings = gateway_settings(nats_server.url, max_body=4096)
    async with running_gateway(settings) as gw:
        assert (
            await gw.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]})
        ).status_code == 201
        big = {"messages": [{"subject": f"{name}.a", "data": "QUFB" * 2000}]}
        body = problem(await gw.post("/v1/publish", json=big), 413, "request.too_large")
        assert "4096" in body["detail"]

        async def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b"x" * 1000

        problem(await gw.post(f"/v1/publish/{name}.a", content=chunks()), 413, "request.too_large")
        problem(
            await gw.put(
                f"/v1/streams/{name}",
                content=chunks(),
                headers={"content-type": "application/json"},
            ),
            413,
        )
        small = await gw.post(f"/v1/publish/{name}.a", content=b"ok")
        assert small.status_code == 200
    assert (await nc.jetstream().stream_info(name)).state.messages == 1


async def test_cors_allowlist(nats_server: EmbeddedServer) -> None:
    settings = gateway_settings(nats_server.url, cors_origins=["https://console.example"])
    async with running_gateway(settings) as gw:
        preflight = await gw.options(
            "/v1/kv",
            headers={
                "Origin": "https://console.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://console.example"
        other = await gw.options(
            "/v1/kv",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in other.headers
        simple = await gw.get("/healthz", headers={"Origin": "https://console.example"})
        assert simple.headers["access-control-allow-origin"] == "https://console.example"
        assert "X-Request-ID" in simple.headers["access-control-expose-headers"]
