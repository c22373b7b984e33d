"""Request bodies are capped before they are buffered."""

from __future__ import annotations

import nats

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway


async def test_body_limit(nats_server: EmbeddedServer, nc: nats.NATS, name: str) -> None:
    settings = gateway_settings(nats_server.url, max_body=4096)
    async with running_gateway(settings) as gw:
        assert (await gw.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]})).status_code == 201
        big = {"messages": [{"subject": f"{name}.a", "data": "QUFB" * 2000}]}
        body = problem(await gw.post("/v1/publish", json=big), 413, "request.too_large")
        assert "4096" in body["detail"]

        async def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b"x" * 1000

        problem(await gw.post(f"/v1/publish/{name}.a", content=chunks()), 413, "request.too_large")
        problem(await gw.put(f"/v1/streams/{name}", content=chunks(),
                             headers={"content-type": "application/json"}), 413)
        small = await gw.post(f"/v1/publish/{name}.a", content=b"ok")
        assert small.status_code == 200
    assert (await nc.jetstream().stream_info(name)).state.messages == 1
