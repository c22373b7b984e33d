"""A single nats-server stopped and started again while HTTP clients keep the gateway busy.

While the server is down the gateway answers at once with 503 and Retry-After (or 504 for a
request that was in flight), never 500; within a few seconds of the restart every kind of
request succeeds again; and what was acknowledged before, during and after is stored once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from tests.cluster import off_loop
from tests.faults.history import History, stored_messages
from tests.helpers import gateway_settings, served_gateway

pytestmark = pytest.mark.slow

CLIENTS = 6
DOWN = 2.0
RECOVERY = 5.0  # seconds after the restart within which every operation must succeed again


async def client(
    http: httpx.AsyncClient,
    stream: str,
    index: int,
    stop: asyncio.Event,
    history: History,
    acked: dict[str, int],
    refused: set[str],
) -> None:
    step = 0
    while not stop.is_set():
        op = ("publish", "stream.info", "direct.get")[(index + step) % 3]
        step += 1
        started = time.monotonic()
        if op == "publish":
            msg_id = f"c{index}-{step}"
            response = await http.post(
                f"/v1/publish/{stream}.c{index}",
                content=msg_id.encode(),
                headers={"Nats-Msg-Id": msg_id},
            )
            if response.status_code == 200:
                acked[msg_id] = response.json()["seq"]
            elif response.status_code == 503:
                refused.add(msg_id)
        elif op == "stream.info":
            response = await http.get(f"/v1/streams/{stream}")
        else:
            response = await http.get(f"/v1/streams/{stream}/direct", params={"seq": 1})
        history.record(op, started, response)
        await asyncio.sleep(0.01 if response.status_code == 200 else 0.05)


async def test_restart_under_load(own_nats_server: EmbeddedServer) -> None:
    server = own_nats_server
    stream = f"R{uuid.uuid4().hex[:10]}"
    history = History()
    acked: dict[str, int] = {}
    refused: set[str] = set()
    settings = gateway_settings(server.url, request_timeout=2.0, reconnect_wait=0.2)
    with served_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:
            created = await http.put(
                f"/v1/streams/{stream}", json={"subjects": [f"{stream}.>"], "allow_direct": True}
            )
            assert created.status_code == 201, created.text
            first = await http.post(f"/v1/publish/{stream}.first", content=b"first")
            assert first.status_code == 200, first.text

            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(client(http, stream, i, stop, history, acked, refused))
                for i in range(CLIENTS)
            ]
            await asyncio.sleep(1.0)
            stopped_at = time.monotonic()
            await off_loop(server.stop)
            await asyncio.sleep(DOWN)
            await off_loop(server.start)
            restarted_at = time.monotonic()
            recovered = await _wait_recovered(history, restarted_at, RECOVERY + 2)
            steady_from = time.monotonic()
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)

    summary = history.summary()
    assert not history.unexpected({200, 503, 504}), f"unexpected statuses:\n{summary}"
    assert all(c.retry_after for c in history.calls if c.status == 503), summary
    down = [c for c in history.calls if stopped_at < c.started < restarted_at]
    assert any(c.status == 503 for c in down), f"no 503 while the server was down\n{summary}"
    # Refused at once, not after the request timeout: no connection, no waiting.
    unavailable = [c for c in down if c.code == "nats.unavailable"]
    assert unavailable and max(c.ended - c.started for c in unavailable) < 1.0, summary
    for op in ("publish", "stream.info", "direct.get"):
        assert recovered.get(op) is not None, f"{op} did not succeed within {RECOVERY + 2}s"
        assert recovered[op] - restarted_at < RECOVERY, (op, recovered[op] - restarted_at)
    steady = [c for c in history.calls if c.started > steady_from]
    assert steady and all(c.status == 200 for c in steady), f"not fully recovered\n{summary}"

    stored: dict[str, list[int]] = defaultdict(list)
    for message in await stored_messages([server.url], stream):
        if message["subject"] != f"{stream}.first":
            stored[message["headers"]["Nats-Msg-Id"]].append(message["seq"])
    assert {i: s for i, s in acked.items() if stored.get(i) != [s]} == {}, "acked but not stored"
    assert not [i for i in refused if i in stored], "answered 503 but stored"
    print(
        f"\n{summary}\nrecovered after: "
        + ", ".join(f"{op} {t - restarted_at:.2f}s" for op, t in sorted(recovered.items()))
    )


async def _wait_recovered(history: History, since: float, timeout: float) -> dict[str, float]:
    """When each operation first succeeded after ``since`` (waiting up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        recovered: dict[str, float] = {}
        for call in history.calls:
            if call.started >= since and call.status == 200 and call.op not in recovered:
                recovered[call.op] = call.ended
        if len(recovered) == 3 or time.monotonic() > deadline:
            return recovered
        await asyncio.sleep(0.05)
