"""ADR-42 priority groups over HTTP against a real nats-server: overflow, pinned_client, unpin."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway
from tests.integration.consumer_support import ack, fetch, info, publish, setup

pytestmark = pytest.mark.server("2.11")  # priority groups


async def test_overflow_serves_a_pull_only_above_its_thresholds(
    gateway: httpx.AsyncClient, name: str, nats_release: tuple[int, int]
) -> None:
    prefix = await setup(gateway, name, priority_groups=["jobs"], priority_policy="overflow")
    await publish(gateway, prefix, 5)
    above = await fetch(gateway, name, group="jobs", min_pending=10, max_messages=5, expires=1)
    assert above.status_code == 200 and above.json()["messages"] == []
    # Served while the backlog is at least 3: messages 1-3 (then 2 are left, below the mark).
    below = await fetch(gateway, name, group="jobs", min_pending=3, max_messages=5, expires=1)
    assert [m["seq"] for m in below.json()["messages"]] == [1, 2, 3]
    # 4 pending, 3 awaiting their ack: min_ack_pending decides (either one suffices).
    await publish(gateway, prefix, 2, start=5)
    nothing = await fetch(gateway, name, group="jobs", min_pending=10, min_ack_pending=4, expires=1)
    assert nothing.json()["messages"] == []
    either = await fetch(
        gateway, name, group="jobs", min_pending=10, min_ack_pending=3, max_messages=2, expires=1
    )
    if nats_release >= (2, 12):
        served = either
    else:  # 2.11 serves a pull only when every threshold it names is met
        assert either.json()["messages"] == []
        served = await fetch(
            gateway, name, group="jobs", min_ack_pending=3, max_messages=2, expires=1
        )
    assert [m["seq"] for m in served.json()["messages"]] == [4, 5]
    # Pulls must name one of the consumer's groups.
    problem(await fetch(gateway, name, group="other", expires=1), 409, "consumer.group_invalid")
    problem(await fetch(gateway, name, expires=1), 409, "consumer.group_required")
    problem(
        await fetch(gateway, name, group="jobs", pin="abc", expires=1),
        409,
        "consumer.not_pinned_client",
    )


async def test_pinned_client_holds_the_others_then_fails_over(
    gateway: httpx.AsyncClient, name: str
) -> None:
    prefix = await setup(
        gateway, name, priority_groups=["jobs"], priority_policy="pinned_client", priority_timeout=2
    )
    await publish(gateway, prefix, 3)
    first = await fetch(gateway, name, group="jobs", expires=1)
    pin = first.json()["pin_id"]
    assert pin and first.headers["nats-pin-id"] == pin
    assert [m["seq"] for m in first.json()["messages"]] == [1]
    await ack(gateway, name, [{"token": first.json()["messages"][0]["ack_token"]}])

    async def pinned_pull() -> httpx.Response:
        await asyncio.sleep(0.2)  # the other client is already waiting
        return await fetch(gateway, name, pin=pin, group="jobs", expires=1)

    other, pinned = await asyncio.gather(
        fetch(gateway, name, group="jobs", expires=1), pinned_pull()
    )
    assert other.status_code == 200 and other.json()["messages"] == []  # held
    assert "pin_id" not in other.json() and "nats-pin-id" not in other.headers
    assert [m["seq"] for m in pinned.json()["messages"]] == [2]
    assert pinned.json()["pin_id"] == pin
    state = await info(gateway, name)
    assert state["priority_groups"][0]["pinned_client_id"] == pin
    assert state["priority_groups"][0]["pinned_ts"].endswith("Z")

    # The pinned client goes quiet for longer than priority_timeout: the other takes over.
    await asyncio.sleep(2.3)
    takeover = await fetch(gateway, name, group="jobs", expires=1)
    new_pin = takeover.json()["pin_id"]
    assert [m["seq"] for m in takeover.json()["messages"]] == [3]
    assert new_pin and new_pin != pin
    body = problem(
        await fetch(gateway, name, pin=pin, group="jobs", expires=1), 423, "consumer.pin_mismatch"
    )
    assert body["nats"]["code"] == 423
    next_one = await gateway.post(
        f"/v1/streams/{name}/consumers/C/next",
        json={"group": "jobs", "expires": 1},
        headers={"Nats-Pin-Id": pin},
    )
    problem(next_one, 423, "consumer.pin_mismatch")
    # The new pin keeps working, also for next (204 carries the pin back).
    empty = await gateway.post(
        f"/v1/streams/{name}/consumers/C/next",
        json={"group": "jobs", "expires": 1},
        headers={"Nats-Pin-Id": new_pin},
    )
    assert empty.status_code == 204 and empty.headers["nats-pin-id"] == new_pin


async def test_unpin_moves_the_pin(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name, priority_groups=["jobs"], priority_policy="pinned_client")
    await publish(gateway, prefix, 2)
    first = await fetch(gateway, name, group="jobs", expires=1)
    pin = first.json()["pin_id"]
    assert pin

    started = time.monotonic()
    unpinned = await gateway.post(f"/v1/streams/{name}/consumers/C/unpin", json={"group": "jobs"})
    assert unpinned.status_code == 204, unpinned.text
    assert "pinned_client_id" not in (await info(gateway, name))["priority_groups"][0]
    moved = await fetch(gateway, name, group="jobs", expires=1)
    assert [m["seq"] for m in moved.json()["messages"]] == [2]
    assert moved.json()["pin_id"] not in (None, pin)
    assert time.monotonic() - started < 1.0  # not the 2 minute default priority_timeout
    problem(
        await fetch(gateway, name, pin=pin, group="jobs", expires=1), 423, "consumer.pin_mismatch"
    )

    url = f"/v1/streams/{name}/consumers/C/unpin"
    problem(await gateway.post(url, json={"group": "other"}), 409, "consumer.group_invalid")
    problem(await gateway.post(url, json={"group": "a b"}), 400, "request.invalid")
    problem(await gateway.post(url, json={"group": "x" * 17}), 400, "request.invalid")
    problem(await gateway.post(url, json={}), 400, "request.invalid")
    problem(
        await gateway.post(f"/v1/streams/{name}/consumers/NOPE/unpin", json={"group": "jobs"}),
        404,
        "consumer.not_found",
    )


@pytest.mark.server("2.12")
async def test_prioritized_serves_the_lowest_priority_first(
    gateway: httpx.AsyncClient, name: str
) -> None:
    prefix = await setup(gateway, name, priority_groups=["jobs"], priority_policy="prioritized")

    async def pull(priority: int, delay: float) -> list[int]:
        await asyncio.sleep(delay)
        response = await fetch(gateway, name, group="jobs", priority=priority, expires=1.5)
        return [m["seq"] for m in response.json()["messages"]]

    async def publish_later() -> None:
        await asyncio.sleep(0.5)  # both pulls are waiting by now; the priority 5 one came first
        await publish(gateway, prefix, 1)

    low, high, _ = await asyncio.gather(pull(5, 0), pull(0, 0.2), publish_later())
    assert (high, low) == ([1], [])


async def test_two_replicas_serve_one_pinned_client(nats_server: EmbeddedServer, name: str) -> None:
    # No session state in the gateway: the pin id and the ack tokens travel with the client.
    settings = gateway_settings(nats_server.url, ack_secret="shared-by-the-replicas")
    async with running_gateway(settings) as one, running_gateway(settings) as two:
        prefix = await setup(one, name, priority_groups=["jobs"], priority_policy="pinned_client")
        await publish(one, prefix, 2)
        first = await fetch(one, name, group="jobs", expires=1)
        pin = first.json()["pin_id"]
        second = await fetch(two, name, pin=pin, group="jobs", expires=1)
        assert [m["seq"] for m in second.json()["messages"]] == [2]
        assert second.json()["pin_id"] == pin
        tokens = [{"token": m["ack_token"]} for m in first.json()["messages"]]
        tokens += [{"token": m["ack_token"]} for m in second.json()["messages"]]
        acked = await ack(two, name, tokens)  # tokens of replica one, acked through two
        assert [r["ok"] for r in acked.json()["results"]] == [True, True]
        assert (await info(one, name))["num_ack_pending"] == 0
