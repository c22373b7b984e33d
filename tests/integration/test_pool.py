"""The connection pool when the server goes away and comes back."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import connect_in_order, gateway_settings, problem, running_gateway

pytestmark = pytest.mark.slow


async def wait_ready(gw, seconds: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (await gw.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("gateway did not become ready again")


async def test_down_is_503_fast_and_recovers(own_nats_server: EmbeddedServer, name: str) -> None:
    async with running_gateway(gateway_settings(own_nats_server.url)) as gw:
        created = await gw.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]})
        assert created.status_code == 201

        own_nats_server.stop()
        await asyncio.sleep(0.3)  # let the clients notice the closed sockets
        started = time.monotonic()
        for path in (f"/v1/streams/{name}", "/readyz"):
            body = problem(await gw.get(path), 503, "nats.unavailable")
            assert body["detail"]
        response = await gw.post(f"/v1/publish/{name}.a", content=b"while-down")
        problem(response, 503, "nats.unavailable")
        assert response.headers["retry-after"] == "1"
        assert time.monotonic() - started < 1.0, "503 must be immediate, not a timeout"
        assert (await gw.get("/healthz")).status_code == 200

        own_nats_server.start()
        await wait_ready(gw)
        ok = await gw.post(f"/v1/publish/{name}.a", content=b"after")
        assert ok.status_code == 200, ok.text
        # The publish refused while down was never sent later: only one message is stored.
        assert ok.json()["seq"] == 1
        info = (await gw.get("/v1/info")).json()
        assert sum(c["reconnects"] for c in info["pool"]["connections"]) >= 2


async def test_inflight_request_does_not_hang_when_connection_drops(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    silent = await connect_in_order(own_nats_server.url)

    async def swallow(msg) -> None:  # type: ignore[no-untyped-def]
        own_nats_server.kill()  # the server dies while the request waits for its reply

    await silent.subscribe(f"{name}.wait", cb=swallow)
    await silent.flush()
    async with running_gateway(gateway_settings(own_nats_server.url, request_timeout=1.0)) as gw:
        started = time.monotonic()
        response = await gw.post(f"/v1/publish/{name}.wait", content=b"x")
        elapsed = time.monotonic() - started
        assert response.status_code in (503, 504), response.text
        assert elapsed < 2.5, f"request hung for {elapsed:.1f}s"
    await silent.close()


async def test_connection_given_up_is_replaced(own_nats_server: EmbeddedServer, name: str) -> None:
    settings = gateway_settings(
        own_nats_server.url, max_reconnect_attempts=1, reconnect_wait=0.1, pool_size=1
    )
    async with running_gateway(settings) as gw:
        own_nats_server.stop()
        # nats-py tries once more, gives up and closes the connection; the pool replaces it.
        await asyncio.sleep(1.5)
        problem(await gw.get("/readyz"), 503)
        own_nats_server.start()
        await wait_ready(gw)
        info = (await gw.get("/v1/info")).json()
        assert info["pool"]["connections"][0]["replaced"] >= 1
        metrics = (await gw.get("/metrics")).text
        replaced = re.search(r"^jsgw_nats_connections_replaced_total (\S+)$", metrics, re.M)
        assert replaced is not None and float(replaced.group(1)) >= 1
        created = await gw.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]})
        assert created.status_code == 201


async def test_a_silent_server_is_noticed_within_seconds(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    """A server that stops answering without closing its sockets (SIGSTOP: what a cut link
    looks like) is found dead within a few seconds, not minutes: requests that wait while no
    reply comes make the connections suspect, a ping unanswered for a second takes them out.
    /readyz fails, requests fail fast with 503, and all comes back when the server answers."""
    import os
    import signal

    # The defaults of the gateway's timeouts: the silence is noticed long before a request
    # times out.
    settings = gateway_settings(own_nats_server.url, request_timeout=5.0, reconnect_wait=0.5)
    async with running_gateway(settings) as gw:
        await wait_ready(gw)
        pid = own_nats_server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while (ready := await gw.get("/readyz")).status_code != 503 or (
                ready.json()["code"] != "nats.unavailable"  # not a timeout: the pool knows
            ):
                assert time.monotonic() - stopped < 6.0, "a silent server went unnoticed"
                await asyncio.sleep(0.1)
            noticed = time.monotonic() - stopped
            response = await gw.get(f"/v1/streams/{name}")
            problem(response, 503, "nats.unavailable")
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_ready(gw)
        print(f"silent server noticed after {noticed:.1f} s")
        assert noticed <= 3.5
