"""Pull consumers over HTTP against a real nats-server: admin, fetch/next, acks."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import nats
import orjson
import pytest

from app.nats import acks
from tests.helpers import problem
from tests.integration.consumer_support import ack, fetch, info, publish, setup

# -- administration ------------------------------------------------------------------------


async def test_admin_lifecycle(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await setup(gateway, name, ack_wait="1m30s", max_expires=2.5, inactive_threshold=3600)
    created = await info(gateway, name)
    assert created["config"]["ack_wait"] == 90
    assert created["config"]["max_expires"] == 2.5
    assert created["config"]["durable_name"] == "C"
    assert created["config"]["ack_policy"] == "explicit"  # the gateway's default
    # Durations reach NATS in nanoseconds.
    raw = orjson.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{name}.C", b"")).data)
    assert raw["config"]["ack_wait"] == 90_000_000_000
    assert raw["config"]["max_expires"] == 2_500_000_000

    updated = await gateway.put(
        f"/v1/streams/{name}/consumers/C",
        json={"max_deliver": 5, "backoff": [1, "2s"], "description": "workers"},
    )
    assert updated.status_code == 200, updated.text
    assert updated.json()["config"]["backoff"] == [1, 2]
    assert updated.json()["config"]["description"] == "workers"
    raw = orjson.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{name}.C", b"")).data)
    assert raw["config"]["backoff"] == [1_000_000_000, 2_000_000_000]

    await gateway.put(f"/v1/streams/{name}/consumers/D", json={})
    listing = (await gateway.get(f"/v1/streams/{name}/consumers")).json()
    assert listing["total"] == 2
    assert sorted(c["name"] for c in listing["consumers"]) == ["C", "D"]
    page = (
        await gateway.get(f"/v1/streams/{name}/consumers", params={"limit": 1, "offset": 1})
    ).json()
    assert len(page["consumers"]) == 1 and page["total"] == 2

    assert (await gateway.delete(f"/v1/streams/{name}/consumers/C")).status_code == 204
    problem(await gateway.get(f"/v1/streams/{name}/consumers/C"), 404, "consumer.not_found")
    problem(await gateway.delete(f"/v1/streams/{name}/consumers/C"), 404, "consumer.not_found")
    problem(await gateway.get("/v1/streams/NOPE_STREAM/consumers/C"), 404, "stream.not_found")
    problem(
        await gateway.put("/v1/streams/NOPE_STREAM/consumers/C", json={}), 404, "stream.not_found"
    )


@pytest.mark.server("2.11")
async def test_priority_config_and_server_state_shape(
    gateway: httpx.AsyncClient, name: str
) -> None:
    await setup(
        gateway,
        name,
        priority_groups=["jobs"],
        priority_policy="pinned_client",
        priority_timeout="1m",
    )
    created = await info(gateway, name)
    assert created["config"]["priority_timeout"] == 60
    assert created["config"]["priority_policy"] == "pinned_client"
    # nats-server's shape, not ADR-42's {name, pinned_id}: nothing pinned yet.
    assert created["priority_groups"] == [{"group": "jobs"}]
    # nats-server 2.15 lets the policy change on update (ADR-42 says it may not): server wins.
    switched = await gateway.put(
        f"/v1/streams/{name}/consumers/C",
        json={"priority_groups": ["jobs"], "priority_policy": "overflow"},
    )
    assert switched.status_code == 200, switched.text
    assert switched.json()["config"]["priority_policy"] == "overflow"


async def test_start_times_beyond_the_servers_clock(gateway: httpx.AsyncClient, name: str) -> None:
    """A consumer from a start time after 2262 or before 1678 (what the server's int64
    nanoseconds hold) started at the wrong end: 2999 had every message pending, 1500 none."""
    made = await gateway.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]})
    assert made.status_code == 201, made.text
    for _ in range(3):
        assert (await gateway.post(f"/v1/publish/{name}.a", content=b"x")).status_code == 200
    for start, pending in (("2999-01-01T00:00:00Z", 0), ("1500-01-01T00:00:00Z", 3)):
        config = {"deliver_policy": "by_start_time", "opt_start_time": start}
        consumer = await gateway.put(f"/v1/streams/{name}/consumers/c{start[:4]}", json=config)
        assert consumer.status_code == 201, consumer.text
        assert consumer.json()["num_pending"] == pending, (start, consumer.json())


async def test_bad_configs_create_nothing(gateway: httpx.AsyncClient, name: str) -> None:
    await gateway.put(f"/v1/streams/{name}", json={"subjects": [f"{name.lower()}.>"]})
    url = f"/v1/streams/{name}/consumers/C"
    cases = [
        ({"priority_groups": ["x" * 17], "priority_policy": "overflow"}, "request.invalid"),
        ({"priority_groups": ["a b"], "priority_policy": "overflow"}, "request.invalid"),
        ({"priority_groups": ["jobs\n"], "priority_policy": "overflow"}, "request.invalid"),
        ({"priority_groups": ["jobs"]}, "consumer.priority_policy_required"),
        ({"priority_timeout": 5}, "consumer.priority_policy_required"),
        ({"priority_timeout": 1e-300}, "consumer.priority_policy_required"),  # still > 0
        ({"priority_policy": "pinned_client"}, "consumer.priority_groups_required"),
        (
            {"priority_groups": ["a", "a"], "priority_policy": "overflow"},
            "consumer.group_name_invalid",
        ),
        (
            {"priority_groups": ["jobs"], "priority_policy": "overflow", "ack_policy": "none"},
            "consumer.explicit_ack_required",
        ),
        ({"priority_groups": ["jobs"], "priority_policy": "sticky"}, "request.invalid"),
        ({"deliver_subject": "push.here"}, "request.invalid"),
        ({"idle_heartbeat": 5}, "request.invalid"),
        ({"durable_name": "other"}, "consumer.name_mismatch"),
        ({"ack_wait": "soon"}, "request.invalid"),
        ({"opt_start_time": "yesterday"}, "request.invalid"),
        ({"filter_subject": "a b"}, "request.invalid"),
        ({"unknown_field": 1}, "request.invalid"),
    ]
    for body, code in cases:
        problem(await gateway.put(url, json=body), 400, code)
    problem(
        await gateway.put(f"/v1/streams/{name}/consumers/a.b", json={}),
        400,
        "consumer.name_invalid",
    )
    problem(
        await gateway.put(f"/v1/streams/{name}/consumers/a%0A", json={}),
        400,
        "consumer.name_invalid",
    )
    assert (await gateway.get(f"/v1/streams/{name}/consumers")).json()["total"] == 0


async def test_server_refusals_map_by_err_code(gateway: httpx.AsyncClient, name: str) -> None:
    await setup(gateway, name)
    body = problem(
        await gateway.put(f"/v1/streams/{name}/consumers/C", json={"deliver_policy": "new"}),
        409,
        "consumer.not_updatable",
    )
    assert body["nats"]["err_code"] == 10012
    await gateway.put(
        f"/v1/streams/{name}W", json={"subjects": [f"{name.lower()}w.>"], "retention": "workqueue"}
    )
    await gateway.put(f"/v1/streams/{name}W/consumers/A", json={})
    body = problem(
        await gateway.put(f"/v1/streams/{name}W/consumers/B", json={}),
        409,
        "consumer.workqueue_overlap",
    )
    assert body["nats"]["err_code"] == 10099


# -- fetch and next ------------------------------------------------------------------------


async def test_workqueue_drained_by_three_fetchers_exactly_once(
    gateway: httpx.AsyncClient, name: str
) -> None:
    prefix = await setup(gateway, name, stream_config={"retention": "workqueue"})
    total = 90
    await publish(gateway, prefix, total)
    seen: list[list[int]] = [[], [], []]

    async def worker(index: int) -> None:
        while True:
            response = await fetch(gateway, name, max_messages=7, no_wait=True)
            assert response.status_code == 200, response.text
            messages = response.json()["messages"]
            if not messages:
                return
            for message in messages:
                assert base64.b64decode(message["data"]) == f"m{message['seq'] - 1}".encode()
                assert message["delivered"] == 1
            acked = await ack(gateway, name, [{"token": m["ack_token"]} for m in messages])
            assert all(r["ok"] for r in acked.json()["results"]), acked.text
            seen[index].extend(m["seq"] for m in messages)

    await asyncio.gather(*(worker(i) for i in range(3)))
    everything = [seq for worker_seen in seen for seq in worker_seen]
    assert sorted(everything) == list(range(1, total + 1))  # each exactly once
    assert sum(1 for worker_seen in seen if worker_seen) >= 2  # the work was shared
    state = (await gateway.get(f"/v1/streams/{name}")).json()["state"]
    assert state["messages"] == 0  # every ack was applied: the work queue is empty


async def test_fetch_and_next_end_quietly(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name)
    started = time.monotonic()
    empty = await fetch(gateway, name, max_messages=5, no_wait=True)
    assert empty.status_code == 200 and empty.json() == {"messages": []}
    assert "nats-pin-id" not in empty.headers
    assert time.monotonic() - started < 0.5, "no_wait without expires answers at once"

    started = time.monotonic()
    expired = await fetch(gateway, name, max_messages=5, expires=1)
    assert expired.status_code == 200 and expired.json()["messages"] == []
    assert 0.9 <= time.monotonic() - started < 2.5  # the server's 408 ended it

    none = await gateway.post(f"/v1/streams/{name}/consumers/C/next", json={"no_wait": True})
    assert none.status_code == 204 and none.content == b""

    await publish(gateway, prefix, 3)
    batch = await fetch(gateway, name, max_messages=2, expires=5)
    messages = batch.json()["messages"]
    assert [m["seq"] for m in messages] == [1, 2]
    assert [m["consumer_seq"] for m in messages] == [1, 2]
    assert [m["pending"] for m in messages] == [2, 1]
    assert messages[0]["subject"] == f"{prefix}.0" and messages[0]["time"].endswith("Z")
    one = await gateway.post(f"/v1/streams/{name}/consumers/C/next")
    assert one.status_code == 200 and one.json()["seq"] == 3


async def test_fetch_waits_through_heartbeats_and_many_acks_are_confirmed(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A fetch with idle heartbeats takes what comes while it waits (heartbeats are no
    messages, nor the end); then 300 messages fetched and acked in one request each."""
    prefix = await setup(gateway, name, ack_wait=30)

    async def later() -> None:
        await asyncio.sleep(1.2)  # after the first heartbeats
        for i in range(2):
            await nc.publish(f"{prefix}.late", f"late{i}".encode())
        await nc.flush()

    task = asyncio.ensure_future(later())
    started = time.monotonic()
    waited = await fetch(gateway, name, max_messages=2, expires=3, idle_heartbeat=0.5)
    await task
    assert waited.status_code == 200, waited.text
    got = waited.json()["messages"]
    assert [base64.b64decode(m["data"]) for m in got] == [b"late0", b"late1"]
    assert 1.1 <= time.monotonic() - started < 2.5, "answered once the batch was complete"

    js = nc.jetstream()
    await asyncio.gather(*(js.publish(f"{prefix}.{i}", b"m") for i in range(300)))
    batch = await fetch(gateway, name, max_messages=300, expires=2)
    messages = batch.json()["messages"]
    assert [m["seq"] for m in messages] == list(range(3, 303))
    assert [m["pending"] for m in messages][-1] == 0
    acked = await ack(gateway, name, [{"token": m["ack_token"]} for m in got + messages])
    assert acked.status_code == 200, acked.text
    results = acked.json()["results"]
    assert [r["index"] for r in results] == list(range(302))
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:3]
    assert [r["seq"] for r in results] == list(range(1, 303))
    state = await info(gateway, name)
    assert state["num_ack_pending"] == 0 and state["num_pending"] == 0


async def test_fetch_by_bytes(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name, max_batch=3)
    for i in range(5):
        await gateway.post(f"/v1/publish/{prefix}.{i}", content=b"x" * 100)
    # Each message counts subject + ack subject + payload (> 100, < 200 bytes) against max_bytes.
    one = await fetch(gateway, name, max_bytes=250, expires=2)
    assert [m["seq"] for m in one.json()["messages"]] == [1]
    # By bytes, the batch stays within the consumer's max_batch instead of being refused.
    capped = await fetch(gateway, name, max_bytes=10_000, expires=2)
    assert capped.status_code == 200, capped.text
    assert [m["seq"] for m in capped.json()["messages"]] == [2, 3, 4]


@pytest.mark.server("2.11")
async def test_bad_pulls_are_4xx_and_deliver_nothing(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name, max_batch=2, max_expires="10s")
    await setup(gateway, f"{name}P", priority_groups=["jobs"], priority_policy="pinned_client")
    await publish(gateway, prefix, 3)
    await publish(gateway, f"{name.lower()}p", 1)
    cases = [
        ({"max_messages": 1, "max_bytes": 100}, "consumer.fetch_invalid"),
        ({"expires": 0.5}, "consumer.expires_invalid"),
        ({"expires": "301s"}, "consumer.expires_invalid"),
        ({"max_messages": 1001}, "consumer.fetch_invalid"),
        ({"max_bytes": 64 * 1024 * 1024}, "consumer.fetch_invalid"),
        ({"min_pending": 5}, "consumer.group_options"),
        ({"priority": 3}, "consumer.group_options"),
        ({"idle_heartbeat": 2, "expires": 3}, "consumer.heartbeat_invalid"),
        ({"idle_heartbeat": 0.1, "expires": 3}, "consumer.heartbeat_invalid"),
        ({"idle_heartbeat": 1, "no_wait": True}, "consumer.heartbeat_invalid"),
        ({"max_messages": 0}, "request.invalid"),
        ({"priority": 10, "group": "jobs"}, "request.invalid"),
        ({"group": "no spaces"}, "request.invalid"),
        ({"batch": 1}, "request.invalid"),
    ]
    for body, code in cases:
        problem(await fetch(gateway, name, **body), 400, code)
    # What the request asks is well formed, but this consumer refuses it: 409.
    conflicts = [
        ({"max_messages": 3}, "consumer.max_batch_exceeded"),  # the server's 409, mapped
        ({"expires": 20}, "consumer.max_expires_exceeded"),
        ({"group": "jobs"}, "consumer.group_invalid"),  # it has no groups at all
        ({"group": "jobs", "expires": 11}, "consumer.max_expires_exceeded"),  # checked here
    ]
    for body, code in conflicts:
        problem(await fetch(gateway, name, **body), 409, code)
    for pin in ("x" * 65, "has space", "tab\there"):
        problem(await fetch(gateway, name, pin=pin, group="jobs"), 400, "consumer.pin_id_invalid")
    for pin in ("abc\r\nX-Evil: 1", "abc\n"):  # refused in any header (app.middleware)
        problem(await fetch(gateway, name, pin=pin, group="jobs"), 400, "header.invalid")
    problem(await fetch(gateway, name, pin="abc"), 400, "consumer.group_options")
    problem(
        await fetch(gateway, f"{name}P", consumer="C", group="other"), 409, "consumer.group_invalid"
    )
    problem(
        await fetch(gateway, f"{name}P", consumer="C", max_messages=1),
        409,
        "consumer.group_required",
    )
    problem(await fetch(gateway, name, consumer="a.b"), 400, "consumer.name_invalid")
    # None of these delivered anything.
    for stream in (name, f"{name}P"):
        state = await info(gateway, stream)
        assert state["delivered"]["consumer_seq"] == 0 and state["num_ack_pending"] == 0


async def test_pull_refusals_from_the_server(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await setup(gateway, name)
    problem(await fetch(gateway, name, consumer="MISSING"), 404, "consumer.not_found")
    problem(await fetch(gateway, "MISSING_STREAM"), 404, "stream.not_found")
    # A push consumer (the gateway refuses to make one, so make it directly).
    config = {"durable_name": "PUSH", "ack_policy": "explicit", "deliver_subject": "push.x"}
    await nc.request(
        f"$JS.API.CONSUMER.CREATE.{name}.PUSH",
        orjson.dumps({"stream_name": name, "config": config}),
    )
    problem(await fetch(gateway, name, consumer="PUSH"), 409, "consumer.push_based")

    async def delete_soon() -> None:
        await asyncio.sleep(0.3)
        deleted = orjson.loads((await nc.request(f"$JS.API.CONSUMER.DELETE.{name}.C", b"")).data)
        assert deleted["success"] is True

    deleting = asyncio.create_task(delete_soon())
    body = problem(await fetch(gateway, name, max_messages=5, expires=5), 404, "consumer.deleted")
    assert body["nats"] == {"code": 409, "description": "Consumer Deleted"}
    await deleting


# -- acks ----------------------------------------------------------------------------------


async def test_every_ack_kind_is_confirmed(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name)
    await publish(gateway, prefix, 4)
    messages = (await fetch(gateway, name, max_messages=4, expires=2)).json()["messages"]
    kinds = [
        {"kind": "ack"},
        {"kind": "nak"},
        {"kind": "wpi"},
        {"kind": "term", "reason": "bad input"},
    ]
    response = await ack(
        gateway,
        name,
        [{"token": m["ack_token"], **k} for m, k in zip(messages, kinds, strict=True)],
    )
    assert response.status_code == 200, response.text
    assert response.json()["results"] == [{"index": i, "ok": True, "seq": i + 1} for i in range(4)]
    # The nak'd message comes back at once; the acked and termed ones never do.
    again = (await fetch(gateway, name, max_messages=4, expires=1)).json()["messages"]
    assert [(m["seq"], m["delivered"]) for m in again] == [(2, 2)]
    # Acking twice is harmless: the server confirms again.
    twice = await ack(gateway, name, [{"token": messages[0]["ack_token"]}])
    assert twice.json()["results"][0]["ok"] is True
    state = await info(gateway, name)
    assert state["num_ack_pending"] == 2  # the redelivered nak and the wpi one


async def test_nak_with_delay_redelivers_after_the_delay(
    gateway: httpx.AsyncClient, name: str
) -> None:
    prefix = await setup(gateway, name)
    await publish(gateway, prefix, 1)
    message = (await fetch(gateway, name, expires=2)).json()["messages"][0]
    naked_at = time.monotonic()
    response = await ack(
        gateway, name, [{"token": message["ack_token"], "kind": "nak", "delay": "1s"}]
    )
    assert response.json()["results"][0]["ok"] is True
    assert (await fetch(gateway, name, no_wait=True)).json()["messages"] == []
    again = (await fetch(gateway, name, expires=4)).json()["messages"]
    assert [(m["seq"], m["delivered"]) for m in again] == [(1, 2)]
    assert time.monotonic() - naked_at >= 0.9


async def test_term_stops_redelivery(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name, ack_wait=1)
    await publish(gateway, prefix, 2)
    first, second = (await fetch(gateway, name, max_messages=2, expires=2)).json()["messages"]
    termed = await ack(
        gateway, name, [{"token": first["ack_token"], "kind": "term", "reason": "poison"}]
    )
    assert termed.json()["results"][0]["ok"] is True
    # After ack_wait the un-acked message comes back; without the term the first (lower
    # sequence) one would come back first.
    again = (await fetch(gateway, name, expires=2.5)).json()["messages"]
    assert [(m["seq"], m["delivered"]) for m in again] == [(second["seq"], 2)]
    await ack(gateway, name, [{"token": again[0]["ack_token"]}])
    assert (await fetch(gateway, name, max_messages=2, expires=1.5)).json()["messages"] == []


async def test_wpi_extends_the_ack_deadline(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name, ack_wait=1.5)
    await publish(gateway, prefix, 2)
    kept, dropped = (await fetch(gateway, name, max_messages=2, expires=2)).json()["messages"]

    async def keep_working() -> None:
        for _ in range(5):
            await asyncio.sleep(0.5)
            response = await ack(gateway, name, [{"token": kept["ack_token"], "kind": "wpi"}])
            assert response.json()["results"][0]["ok"] is True

    worker = asyncio.create_task(keep_working())
    # Within 2.6 s (well past ack_wait) only the message without progress reports comes back.
    redelivered = (await fetch(gateway, name, max_messages=2, expires=2.6)).json()["messages"]
    await worker
    assert [(m["seq"], m["delivered"]) for m in redelivered] == [(dropped["seq"], 2)]
    done = await ack(gateway, name, [{"token": kept["ack_token"]}])
    assert done.json()["results"][0]["ok"] is True


async def test_forged_or_foreign_tokens_publish_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    prefix = await setup(gateway, name)
    await gateway.put(f"/v1/streams/{name}/consumers/OTHER", json={})
    await publish(gateway, prefix, 1)
    token = (await fetch(gateway, name, expires=2)).json()["messages"][0]["ack_token"]
    acks_seen: list[str] = []

    async def seen(msg) -> None:  # type: ignore[no-untyped-def]
        acks_seen.append(msg.subject)

    spy = await nc.subscribe("$JS.ACK.>", cb=seen)
    await nc.flush()
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    tampered_subject = raw.replace(b".1.1.1.", b".1.1.2.")  # another delivery, same MAC
    flipped_mac = raw[:-1] + bytes([raw[-1] ^ 1])
    other_secret = acks.sign(b"not the gateway's secret", name, "C", raw[1:-32].decode())
    forgeries = [
        base64.urlsafe_b64encode(tampered_subject).rstrip(b"=").decode(),
        base64.urlsafe_b64encode(flipped_mac).rstrip(b"=").decode(),
        other_secret,
        "not-a-token",
        "!!!",
        token + "\n",
        "A" * 2000,
    ]
    for forged in forgeries:
        response = await ack(gateway, name, [{"token": forged}])
        body = problem(response, 400, "ack.token_invalid" if len(forged) <= 1024 else None)
        assert body["detail"]
    # A genuine token of another consumer: refused, nothing published.
    problem(
        await ack(gateway, name, [{"token": token}], consumer="OTHER"), 403, "ack.token_foreign"
    )
    # One bad token rejects the whole batch: the good one is not acked either.
    problem(
        await ack(gateway, name, [{"token": token}, {"token": forgeries[1]}]),
        400,
        "ack.token_invalid",
    )
    problem(await ack(gateway, name, [{"token": token, "delay": 1}]), 400, "ack.invalid")
    problem(
        await ack(gateway, name, [{"token": token, "kind": "term", "reason": "a\r\nb"}]),
        400,
        "ack.invalid",
    )
    problem(await ack(gateway, name, [{"token": token, "kind": "maybe"}]), 400, "request.invalid")
    problem(await ack(gateway, name, []), 400, "request.invalid")
    await nc.flush()
    await asyncio.sleep(0.1)
    assert acks_seen == []
    assert (await info(gateway, name))["num_ack_pending"] == 1

    ok = await ack(gateway, name, [{"token": token}])
    assert ok.json()["results"] == [{"index": 0, "ok": True, "seq": 1}]
    await nc.flush()
    await asyncio.sleep(0.1)
    assert len(acks_seen) == 1 and acks_seen[0].startswith(f"$JS.ACK.{name}.C.")
    assert (await info(gateway, name))["num_ack_pending"] == 0
    await spy.unsubscribe()


async def test_ack_for_a_deleted_consumer(gateway: httpx.AsyncClient, name: str) -> None:
    prefix = await setup(gateway, name)
    await publish(gateway, prefix, 1)
    token = (await fetch(gateway, name, expires=2)).json()["messages"][0]["ack_token"]
    await gateway.delete(f"/v1/streams/{name}/consumers/C")
    result = (await ack(gateway, name, [{"token": token}])).json()["results"][0]
    assert result["ok"] is False and result["error"]["code"] == "consumer.not_found"
    assert json.dumps(result)  # one result per ack, even when it failed


# -- pause and resume ------------------------------------------------------------------------


@pytest.mark.server("2.11")
async def test_pause_holds_deliveries_until_resumed(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    prefix = await setup(gateway, name)
    await publish(gateway, prefix, 2)
    base = f"/v1/streams/{name}/consumers/C"

    paused = await gateway.post(f"{base}/pause", json={"until": "1h"})
    assert paused.status_code == 200, paused.text
    state = paused.json()
    assert state["paused"] is True and 3590 < state["pause_remaining"] <= 3600
    assert state["pause_until"].endswith("Z")
    shown = await info(gateway, name)
    assert shown["paused"] is True and shown["pause_remaining"] > 3590
    assert shown["config"]["pause_until"] == state["pause_until"]
    raw = orjson.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{name}.C", b"")).data)
    assert raw["paused"] is True
    # While paused, a pull waits and gets nothing.
    held = await fetch(gateway, name, max_messages=2, expires=1)
    assert held.status_code == 200 and held.json()["messages"] == []

    resumed = await gateway.post(f"{base}/resume")
    assert resumed.json() == {"paused": False}
    assert "paused" not in await info(gateway, name)
    got = await fetch(gateway, name, max_messages=2, expires=2)
    assert [m["seq"] for m in got.json()["messages"]] == [1, 2]

    # An RFC 3339 time in the future pauses until then; one in the past, or no time, is a 400.
    until = "2999-01-01T00:00:00Z"
    at = await gateway.post(f"{base}/pause", json={"until": until})
    assert at.json()["paused"] is True and at.json()["pause_until"].startswith("2999-01-01T00:00")
    for bad in ("2000-01-01T00:00:00Z", "2030-01-01T00:00:00", "soon", "0s", 0, -5, "-1s"):
        problem(await gateway.post(f"{base}/pause", json={"until": bad}), 400)
    problem(await gateway.post(f"{base}/pause", json={"until": True}), 400, "request.invalid")
    assert (await info(gateway, name))["config"]["pause_until"].startswith("2999-01-01")
    problem(
        await gateway.post(f"{base}/pause", json={"until": "0s"}), 400, "consumer.pause_invalid"
    )
    problem(
        await gateway.post(f"/v1/streams/{name}/consumers/NOPE/pause", json={"until": 5}),
        404,
        "consumer.not_found",
    )
    problem(await gateway.post(f"/v1/streams/{name}/consumers/NOPE/resume"), 404)
