"""Caps on open SSE streams, shared by KV watches and consumer streams."""

from __future__ import annotations

import asyncio

import httpx
import nats

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway


async def test_per_client_cap_and_release(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    settings = gateway_settings(nats_server.url, sse_max_per_address=1, sse_heartbeat=1)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(name, durable_name="C", ack_policy="explicit")
    with served_gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as gw:
            assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
            async with gw.stream("GET", f"/v1/kv/{name}/watch") as first:
                assert first.status_code == 200
                lines = first.aiter_lines()
                assert (await anext(lines)).startswith(("event:", "id:", ":"))
                # A second stream of the same client, watch or consume: 429 with Retry-After.
                again = await gw.get(f"/v1/kv/{name}/watch")
                problem(again, 429, "sse.too_many_streams")
                assert again.headers["retry-after"] == "1"
                problem(
                    await gw.get(f"/v1/streams/{name}/consumers/C/consume"),
                    429,
                    "sse.too_many_streams",
                )
            # The slot comes back when the stream ends.
            for _ in range(50):
                async with gw.stream("GET", f"/v1/streams/{name}/consumers/C/consume") as second:
                    if second.status_code == 200:
                        break
                await asyncio.sleep(0.1)
            assert second.status_code == 200


async def test_consume_says_goodbye_on_shutdown(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    from sse_starlette.sse import AppStatus

    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(name, durable_name="C", ack_policy="explicit")
    await js.publish(f"{name}.a", b"one")
    with served_gateway(gateway_settings(nats_server.url)) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as gw,
            gw.stream("GET", f"/v1/streams/{name}/consumers/C/consume") as stream,
        ):
            lines = stream.aiter_lines()
            events: list[str] = []
            while "event: message" not in events:
                events.append(await asyncio.wait_for(anext(lines), 5))
            AppStatus.should_exit = True  # what uvicorn's signal handler sets on SIGTERM
            try:
                rest = []
                async for line in lines:
                    rest.append(line)
            finally:
                AppStatus.should_exit = False
    assert "event: error" in rest
    data = next(line for line in rest if line.startswith("data:") and "gateway.shutdown" in line)
    assert "reconnect" in data
