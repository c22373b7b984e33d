"""The event-stream and write-outcome series, against a real gateway and nats-server: open
SSE streams and KV watches against their caps, streams refused at a cap, watches dropped as
too slow, and publishes answered 504 nats.outcome_unknown."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import httpx
import nats
import nats.aio.msg

from app.nats.embedded import EmbeddedServer
from tests.helpers import (
    connect_in_order,
    gateway_settings,
    problem,
    running_gateway,
    served_gateway,
)
from tests.integration.test_kv_watch import bucket, stalled_watch


def sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name}{labels} in:\n{text}"
    return float(match.group(1))


async def scrape(http: httpx.AsyncClient) -> str:
    answer = await http.get("/metrics")
    assert answer.status_code == 200
    return answer.text


def open_streams(text: str, kind: str) -> float:
    return sample(text, "jsgw_sse_streams_open", f'{{kind="{kind}"}}')


async def until_closed(http: httpx.AsyncClient) -> str:
    """The exposition once every stream is given back (a slot is released when the server
    sees the client go)."""
    deadline = time.monotonic() + 5
    while True:
        text = await scrape(http)
        if open_streams(text, "kv_watch") == open_streams(text, "consume") == 0:
            return text
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.05)


async def test_open_streams_and_their_caps(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    settings = gateway_settings(nats_server.url, sse_max_streams=3, kv_max_watches=7)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(name, durable_name="C", ack_policy="explicit")
    with served_gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            await bucket(http, name)
            text = await scrape(http)
            assert sample(text, "jsgw_sse_streams_limit") == 3
            assert sample(text, "jsgw_kv_watches_limit") == 7
            assert open_streams(text, "kv_watch") == open_streams(text, "consume") == 0
            async with contextlib.AsyncExitStack() as streams:
                paths = [f"/v1/kv/{name}/watch"] * 2 + [f"/v1/streams/{name}/consumers/C/consume"]
                for path in paths:
                    # The slot is taken before the answer starts.
                    response = await streams.enter_async_context(http.stream("GET", path))
                    assert response.status_code == 200
                text = await scrape(http)
                assert open_streams(text, "kv_watch") == 2
                assert open_streams(text, "consume") == 1
                assert sample(text, "jsgw_kv_watches_open") == 2
                # A fourth stream is over the worker's cap.
                problem(await http.get(f"/v1/kv/{name}/watch"), 429, "sse.too_many_streams")
                text = await scrape(http)
                refused = 'jsgw_sse_streams_refused_total{reason="streams"}'
                assert sample(text, refused) == 1
            text = await until_closed(http)
            assert sample(text, "jsgw_kv_watches_open") == 0
            assert sample(text, "jsgw_kv_watches_dropped_total", '{reason="behind"}') == 0


async def test_a_watch_dropped_as_too_slow_is_counted(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """A client that reads nothing falls its queue's length behind: its watch ends with
    kv.watch_too_slow, and the drop is counted."""
    settings = gateway_settings(nats_server.url, sse_queue_size=4, kv_watch_heartbeat=0.5)
    with served_gateway(settings) as served:
        async with httpx.AsyncClient(base_url=served, timeout=10) as http:
            async with stalled_watch(served, nc, name):
                text = await scrape(http)
                dropped = "jsgw_kv_watches_dropped_total"
                assert sample(text, dropped, '{reason="behind"}') == 1
                assert sample(text, dropped, '{reason="stuck"}') == 0
            await until_closed(http)


async def test_publishes_of_unknown_outcome_are_counted(
    nats_server: EmbeddedServer, name: str
) -> None:
    """A subscriber that takes the message and answers nothing: each publish (one, or each
    message of a batch) is answered nats.outcome_unknown and counted once."""
    silent = await connect_in_order(nats_server.url)

    async def swallow(msg: nats.aio.msg.Msg) -> None:
        pass

    await silent.subscribe(f"{name}.silent", cb=swallow)
    await silent.flush()
    counted = 'jsgw_publish_outcome_unknown_total{operation="publish"}'
    try:
        async with running_gateway(gateway_settings(nats_server.url, request_timeout=0.3)) as gw:
            assert sample(await scrape(gw), counted) == 0
            problem(
                await gw.post(f"/v1/publish/{name}.silent", content=b"x"),
                504,
                "nats.outcome_unknown",
            )
            batch = {"messages": [{"subject": f"{name}.silent"}] * 2}
            results = (await gw.post("/v1/publish", json=batch)).json()["results"]
            assert [r["error"]["code"] for r in results] == ["nats.outcome_unknown"] * 2
            text = await scrape(gw)
            assert sample(text, counted) == 3
            assert sample(text, 'jsgw_publish_outcome_unknown_total{operation="kv_write"}') == 0
    finally:
        await silent.close()
