"""ADR-37 consume over SSE against a real nats-server, served by a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway
from tests.integration.consumer_support import ack, info, publish, setup


class EventStream:
    """The events of an SSE response (comments, i.e. the pings, are skipped)."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        self._lines = response.aiter_lines()
        self.others: list[dict[str, Any]] = []  # events other than messages, in order

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        return await asyncio.wait_for(self._read(), timeout)

    async def _read(self) -> dict[str, Any]:
        event: dict[str, Any] = {}
        async for line in self._lines:
            if not line:
                if event:
                    if "data" in event:
                        event["data"] = json.loads(event["data"])
                    return event
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            event[field] = value[1:] if value.startswith(" ") else value
        raise EOFError("the stream ended")

    async def messages(self, count: int, **kwargs: float) -> list[dict[str, Any]]:
        """The data of the next ``count`` message events; other events go to ``others``."""
        out: list[dict[str, Any]] = []
        while len(out) < count:
            event = await self.next(**kwargs)
            if event.get("event") == "message":
                assert int(event["id"]) == event["data"]["seq"]
                out.append(event["data"])
            else:
                self.others.append(event)
        return out


@contextlib.asynccontextmanager
async def consuming(
    http: httpx.AsyncClient, stream: str, **params: object
) -> AsyncIterator[EventStream]:
    async with http.stream("GET", f"/v1/streams/{stream}/consumers/C/consume", params=params) as r:
        yield EventStream(r)


@contextlib.asynccontextmanager
async def http_gateway(url: str) -> AsyncIterator[httpx.AsyncClient]:
    with served_gateway(gateway_settings(url, ack_secret="consume-tests")) as base:
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:
            yield http


async def test_consume_streams_and_refills(nats_server: EmbeddedServer, name: str) -> None:
    async with http_gateway(nats_server.url) as http:
        prefix = await setup(http, name)
        await publish(http, prefix, 5)
        async with consuming(http, name, max_messages=2) as events:
            first = await events.messages(5)
            assert [m["seq"] for m in first] == [1, 2, 3, 4, 5]
            assert all(m["delivered"] == 1 and m["ack_token"] for m in first)
            acked = await ack(http, name, [{"token": m["ack_token"]} for m in first])
            assert all(r["ok"] for r in acked.json()["results"])
            # Later messages arrive on the same stream: the buffer keeps being refilled.
            await publish(http, prefix, 2, start=5)
            later = await events.messages(2)
            assert [m["seq"] for m in later] == [6, 7]
            await ack(http, name, [{"token": m["ack_token"]} for m in later])
            assert events.others == []
        state = await info(http, name)
        assert state["ack_floor"]["stream_seq"] == 7 and state["num_ack_pending"] == 0


async def test_disconnect_stops_pulling_and_acks_nothing(
    nats_server: EmbeddedServer, name: str
) -> None:
    async with http_gateway(nats_server.url) as http:
        prefix = await setup(http, name, ack_wait=1.5)
        await publish(http, prefix, 3)
        async with consuming(http, name, max_messages=10) as events:
            assert [m["seq"] for m in await events.messages(1)] == [1]
        await asyncio.sleep(0.5)
        before = await info(http, name)
        await publish(http, prefix, 3, start=3)
        await asyncio.sleep(0.5)
        after = await info(http, name)
        # Nothing was delivered after the client left, no pull is left waiting, nothing acked.
        assert after["delivered"]["stream_seq"] == before["delivered"]["stream_seq"]
        assert after["num_waiting"] == 0
        assert after["ack_floor"]["stream_seq"] == 0
        delivered_to_gateway = before["delivered"]["stream_seq"]
        assert delivered_to_gateway >= 1
        # What the gateway had but the client never saw comes back after ack_wait.
        response = await http.post(
            f"/v1/streams/{name}/consumers/C/fetch", json={"max_messages": 6, "expires": 4}
        )
        got = {m["seq"]: m["delivered"] for m in response.json()["messages"]}
        assert got == {seq: 2 if seq <= delivered_to_gateway else 1 for seq in range(1, 7)}


@pytest.mark.server("2.11")
async def test_pinned_and_unpinned_events(nats_server: EmbeddedServer, name: str) -> None:
    async with http_gateway(nats_server.url) as http:
        prefix = await setup(http, name, priority_groups=["jobs"], priority_policy="pinned_client")
        async with consuming(http, name, group="jobs") as events:
            await publish(http, prefix, 1)
            pinned = await events.next()
            assert pinned["event"] == "pinned"
            pin = pinned["data"]["pin_id"]
            assert pinned["data"] == {"group": "jobs", "pin_id": pin}
            message = (await events.messages(1))[0]
            assert message["headers"]["Nats-Pin-Id"] == [pin]

            unpin = await http.post(f"/v1/streams/{name}/consumers/C/unpin", json={"group": "jobs"})
            assert unpin.status_code == 204
            await publish(http, prefix, 1, start=1)
            lost = await events.next()
            assert lost == {"event": "unpinned", "data": {"group": "jobs", "pin_id": pin}}
            again = await events.next()
            assert again["event"] == "pinned" and again["data"]["pin_id"] != pin
            assert [m["seq"] for m in await events.messages(1)] == [2]
            state = await info(http, name)
            assert state["priority_groups"][0]["pinned_client_id"] == again["data"]["pin_id"]


async def test_consumer_deleted_ends_the_stream_with_an_error(
    nats_server: EmbeddedServer, name: str
) -> None:
    async with http_gateway(nats_server.url) as http:
        prefix = await setup(http, name)
        async with consuming(http, name) as events:
            await publish(http, prefix, 1)
            await events.messages(1)
            assert (await http.delete(f"/v1/streams/{name}/consumers/C")).status_code == 204
            error = await events.next()
            assert error["event"] == "error"
            assert error["data"]["code"] == "consumer.deleted"
            assert error["data"]["status"] == 404
            with pytest.raises(EOFError):
                await events.next()


async def test_consume_refuses_bad_input_before_streaming(
    gateway: httpx.AsyncClient, name: str
) -> None:
    await setup(gateway, name, max_batch=5)
    url = f"/v1/streams/{name}/consumers/C/consume"
    cases = [
        ({"max_messages": 2, "max_bytes": 100}, 400, "consumer.consume_invalid"),
        ({"max_messages": 6}, 409, "consumer.max_batch_exceeded"),
        ({"max_messages": 4, "threshold_messages": 5}, 400, "consumer.consume_invalid"),
        ({"max_messages": 5000}, 400, "consumer.consume_invalid"),
        ({"max_messages": 4, "expires": 0.5}, 400, "consumer.expires_invalid"),
        ({"max_messages": 4, "idle_heartbeat": 0}, 400, "consumer.heartbeat_invalid"),
        ({"max_messages": 4, "idle_heartbeat": 20}, 400, "consumer.heartbeat_invalid"),
        ({"max_messages": 4, "group": "jobs"}, 409, "consumer.group_invalid"),
        ({"max_messages": 4, "min_pending": 3}, 400, "consumer.group_options"),
        ({"max_messages": 4, "surprise": 1}, 400, "request.invalid"),
        ({"max_messages": 4, "expires": "later"}, 400, "request.invalid"),
    ]
    for params, status, code in cases:
        problem(await gateway.get(url, params=params), status, code)
    # (CR/LF in any header is refused before routing, as header.invalid: see app.middleware)
    bad_pin = await gateway.get(url, params={"max_messages": 4}, headers={"Nats-Pin-Id": "a b"})
    problem(bad_pin, 400, "consumer.pin_id_invalid")
    problem(
        await gateway.get(f"/v1/streams/{name}/consumers/NOPE/consume"), 404, "consumer.not_found"
    )
    state = (await gateway.get(f"/v1/streams/{name}/consumers/C")).json()
    assert state["delivered"]["consumer_seq"] == 0 and state["num_waiting"] == 0


@pytest.mark.slow
async def test_consume_survives_a_server_restart(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    async with http_gateway(own_nats_server.url) as http:
        prefix = await setup(http, name, ack_wait=2)
        await publish(http, prefix, 4)
        async with consuming(http, name, expires=2, idle_heartbeat=1) as events:
            before = await events.messages(4)
            done = await ack(http, name, [{"token": m["ack_token"]} for m in before[:2]])
            assert all(r["ok"] for r in done.json()["results"])

            await asyncio.to_thread(own_nats_server.restart)
            deadline = time.monotonic() + 15
            while (await http.post(f"/v1/publish/{prefix}.4", content=b"m4")).status_code != 200:
                assert time.monotonic() < deadline, "the gateway did not reconnect"
                await asyncio.sleep(0.2)
            # The un-acked 3 and 4 come back, then 5; the acked 1 and 2 never do.
            after = await events.messages(3, timeout=15)
            assert sorted((m["seq"], m["delivered"]) for m in after) == [(3, 2), (4, 2), (5, 1)]
            assert {
                "event": "warning",
                "data": {
                    "code": "nats.disconnected",
                    "detail": (
                        "the gateway lost its NATS connection; pulling resumes when it is back"
                    ),
                },
            } in events.others
            assert not any(e["event"] == "error" for e in events.others)
            done = await ack(http, name, [{"token": m["ack_token"]} for m in after])
            assert all(r["ok"] for r in done.json()["results"]), done.text
        state = await info(http, name)
        assert state["ack_floor"]["stream_seq"] == 5 and state["num_ack_pending"] == 0


@pytest.mark.slow
async def test_missed_heartbeats_warn_and_the_stream_goes_on(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    async with http_gateway(own_nats_server.url) as http:
        prefix = await setup(http, name)
        async with consuming(http, name, expires=2, idle_heartbeat=0.5) as events:
            await publish(http, prefix, 1)
            await events.messages(1)
            pid = own_nats_server.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)  # the server stops answering; the TCP connection stays
            try:
                warning = await events.next(timeout=5)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert warning["event"] == "warning"
            assert warning["data"]["code"] == "consumer.heartbeat_missed"
            await publish(http, prefix, 1, start=1)
            assert [m["seq"] for m in await events.messages(1)] == [2]
