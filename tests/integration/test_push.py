"""Push delivery against a real nats-server, a real gateway and a real HTTP application.

The delivery tests run thousands of messages through a subscription and check from outside
the gateway that every message was delivered and acked at least once, and that none was
acked before the application answered 2xx: the application (tests/push_app.py) records each
2xx it answers, and a NATS subscription of the test's own sees every ack the gateway sends.
At the end the consumer has nothing pending and nothing unacked, and every sequence has a
2xx: a message acked without one would never have been delivered again, so would lack it.
"""

from __future__ import annotations

import asyncio
import base64
import random
import re
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import orjson
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, jsgw_serve, problem, running_gateway
from tests.push_app import (
    AckWatch,
    Answer,
    PushApp,
    Received,
    acked_only_after_2xx,
    consumer_state,
    drained,
    free_port,
    publish,
    until,
)

pytestmark = pytest.mark.server("2.11")  # consumer pause, priority groups

BUCKET = f"subs_{uuid.uuid4().hex[:8]}"
"""Where the module's gateway stores its subscriptions."""


@pytest.fixture(scope="module")
def served(nats_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``jsgw serve`` in a process of its own, for the tests of this module: the application
    runs in the test's process, and each gets a core (and the gateway uvloop)."""
    home = tmp_path_factory.mktemp("push-gateway")
    port = free_port()
    settings = {
        "JSGW_NATS_URL": nats_server.url,
        "JSGW_PORT": str(port),
        "JSGW_SUBSCRIPTIONS_BUCKET": BUCKET,
        "JSGW_PUSH_SHUTDOWN_GRACE": "1",
        "JSGW_ACCESS_LOG": "false",
        "JSGW_DATA_DIR": str(home / "data"),
    }
    url = f"http://127.0.0.1:{port}"
    with jsgw_serve(settings, home / "gateway.log", ready=f"{url}/readyz"):
        yield url


@pytest.fixture
async def gateway(served: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the module's gateway; the test's subscriptions are deleted after it."""
    async with httpx.AsyncClient(base_url=served, timeout=30) as client:
        yield client
        for item in (await client.get("/v1/subscriptions")).json()["subscriptions"]:
            await client.delete(f"/v1/subscriptions/{item['name']}")


async def stream(gateway: httpx.AsyncClient, name: str, **config: Any) -> None:
    created = await gateway.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"], **config})
    assert created.status_code == 201, created.text


async def subscribe(
    gateway: httpx.AsyncClient, name: str, *, status: int = 201, **body: Any
) -> dict[str, Any]:
    body = {"stream": name, "consumer": "push", **body}
    response = await gateway.put(f"/v1/subscriptions/{name}", json=body)
    assert response.status_code == status, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def state(gateway: httpx.AsyncClient, name: str) -> dict[str, Any]:
    response = await gateway.get(f"/v1/subscriptions/{name}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["state"]
    return answer


def unanswered(app: PushApp, count: int) -> list[int]:
    """The sequences 1..count the application never answered 2xx."""
    return [seq for seq in range(1, count + 1) if app.ok[seq] < 1]


async def stored(nc: nats.NATS, stream_name: str) -> list[Any]:
    """Every message of a stream (read with an ephemeral consumer of the test's own)."""
    js = nc.jetstream()
    info = await js.stream_info(stream_name)
    sub = await js.pull_subscribe(">", stream=stream_name)
    messages: list[Any] = []
    while len(messages) < info.state.messages:
        messages += await sub.fetch(min(500, info.state.messages - len(messages)), timeout=5)
    await sub.unsubscribe()
    return messages


# -- nothing lost, nothing acked early -----------------------------------------------------


async def test_an_application_failing_a_fifth_of_the_calls(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    count = 2000
    rng = random.Random(7)

    def flaky(request: Received) -> Answer:
        roll = rng.random()
        if roll < 0.10:
            return Answer(503, headers=[("retry-after", "0")])
        if roll < 0.15:
            return Answer(500, headers=[("retry-after", "0")])
        if roll < 0.19:
            return Answer.json({"status": "RETRY"}, headers=[("retry-after", "0")])
        if roll < 0.20:  # no Retry-After: the default schedule (1 s for a first delivery)
            return Answer.json({"status": "RETRY"}) if request.delivered == 1 else Answer(503)
        return Answer.json({"status": "SUCCESS"}) if roll < 0.6 else Answer(204)

    await stream(gateway, name)
    await publish(nc, f"{name}.orders", count)
    async with PushApp(flaky) as app, AckWatch.on(nc, name, "push") as watch:
        await subscribe(
            gateway, name, endpoint=app.url, concurrency=32, consumer_config={"ack_wait": "5s"}
        )
        await drained(gateway, name, "push", timeout=45)
        assert unanswered(app, count) == []
        assert acked_only_after_2xx(app, watch) == []
        seen = await state(gateway, name)
    assert seen["acked"] == len(watch.acked()) >= count, seen
    assert seen["retried"] == watch.kinds()["-NAK"] >= 0.15 * count, seen
    assert seen["terminated"] == seen["dead_lettered"] == seen["in_flight"] == 0, seen
    assert seen["delivered"] == len(app.received) == seen["acked"] + seen["retried"], seen
    assert seen["last_error"]["detail"].endswith(("HTTP 503", "HTTP 500")), seen
    # The process's metrics say the same, by subscription.
    metrics = (await gateway.get("/metrics")).text
    for family, counted in (("delivered", "delivered"), ("acked", "acked"), ("retried", "retried")):
        assert sample(metrics, f"jsgw_push_{family}_total", name) == seen[counted], family
    assert sample(metrics, "jsgw_push_in_flight", name) == 0
    answers = sample(metrics, "jsgw_push_app_latency_seconds_count", name, outcome="success")
    failures = sum(
        sample(metrics, "jsgw_push_app_latency_seconds_count", name, outcome=outcome)
        for outcome in ("retry", "server_error")
    )
    assert answers + failures == seen["delivered"] and answers == seen["acked"]


def sample(text: str, family: str, subscription: str, **labels: str) -> float:
    """A sample of a /metrics exposition (0 when the series is not there)."""
    wanted = {"subscription": subscription, **labels}
    for line in text.splitlines():
        if not line.startswith(family + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if found == wanted:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_an_application_down_for_10_seconds(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Connections are refused for 10 s: every message is retried along the consumer's
    backoff meanwhile, none is dead-lettered (max_deliver 10 outlasts the outage), and all
    are delivered once the application is back."""
    count = 2000
    await stream(gateway, name)
    await stream(gateway, f"{name}_DLQ", subjects=[f"dlq.{name}"])
    await publish(nc, f"{name}.orders", count)
    app = PushApp()  # not started: nothing listens on its port
    async with AckWatch.on(nc, name, "push") as watch:
        await subscribe(
            gateway,
            name,
            endpoint=app.url,
            concurrency=32,
            dead_letter={"subject": f"dlq.{name}"},
            consumer_config={"backoff": ["1s", "2s", "4s"], "max_deliver": 10},
        )
        await asyncio.sleep(10)
        refused = await state(gateway, name)
        async with app:
            await drained(gateway, name, "push", timeout=40)
            assert unanswered(app, count) == []
            assert acked_only_after_2xx(app, watch) == []
    assert "cannot reach the endpoint" in refused["last_error"]["detail"], refused
    assert refused["retried"] >= 1000 and refused["acked"] == 0, refused
    seen = await state(gateway, name)
    assert seen["dead_lettered"] == seen["terminated"] == 0, seen
    assert (await nc.jetstream().stream_info(f"{name}_DLQ")).state.messages == 0
    # Along the backoff (1 s, 2 s, 4 s, 4 s...): at most 5 deliveries in 10 s of refusals.
    assert max(r.delivered for r in app.received) <= 6


async def test_an_application_slower_than_ack_wait(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """In-progress acks keep every message while the application works on it for 1.5 times
    the consumer's ack_wait: no message is delivered twice. (Batches of 20: 1,000 messages
    out at once, without 1,000 connections to one process that also runs the application.)"""
    count = 2000
    await stream(gateway, name)
    await publish(nc, f"{name}.orders", count)
    async with (
        PushApp(lambda _: Answer(204, delay=2.25)) as app,
        AckWatch.on(nc, name, "push") as watch,
    ):
        await subscribe(
            gateway,
            name,
            endpoint=app.url,
            concurrency=50,
            batch=20,
            timeout=10,
            consumer_config={"ack_wait": "1.5s"},
        )
        await drained(gateway, name, "push", timeout=40)
    items = [item for request in app.received for item in request.json()]
    assert sorted(item["seq"] for item in items) == list(range(1, count + 1))
    assert {item["delivered"] for item in items} == {1}
    kinds = watch.kinds()
    assert kinds["+ACK"] == count and kinds["+WPI"] >= count and set(kinds) == {"+ACK", "+WPI"}
    seen = await state(gateway, name)
    assert seen["acked"] == count and seen["retried"] == 0, seen


async def test_a_stalled_application_costs_no_more_than_the_bound(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """With the application stalled, the gateway holds exactly concurrency x batch messages
    (what the server counts as delivered and not acked, what the runner holds, the POSTs
    the application holds) and pulls no more; then everything is delivered."""
    count = 2000
    concurrency, batch = 8, 5
    release = asyncio.Event()

    async def stalled(_: Received) -> Answer:
        await release.wait()
        return Answer(200)

    await stream(gateway, name)
    await publish(nc, f"{name}.orders", count)
    async with PushApp(stalled) as app:
        await subscribe(
            gateway,
            name,
            endpoint=app.url,
            concurrency=concurrency,
            batch=batch,
            timeout=60,
            consumer_config={"ack_wait": "30s"},
        )
        await until(lambda: app.in_flight == concurrency, 10, "every POST held")
        bound = concurrency * batch
        for _ in range(10):  # 2 s of a stalled application
            server = await consumer_state(gateway, name, "push")
            runner = await state(gateway, name)
            assert server["num_ack_pending"] == bound, server
            assert runner["in_flight"] == bound, runner
            assert app.in_flight == concurrency
            assert sum(len(r.json()) for r in app.received) == bound
            await asyncio.sleep(0.2)
        assert server["num_pending"] == count - bound
        release.set()
        await drained(gateway, name, "push", timeout=30)
    delivered = sorted(item["seq"] for request in app.received for item in request.json())
    assert delivered == list(range(1, count + 1))
    assert app.max_in_flight == concurrency
    assert max(len(request.json()) for request in app.received) == batch


# -- dead letters --------------------------------------------------------------------------


async def test_poison_messages_reach_the_dead_letter_stream_after_max_deliver(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    count, every = 2000, 50
    poison = set(range(every, count + 1, every))

    def picky(request: Received) -> Answer:
        if request.seq in poison:
            return Answer(500, headers=[("retry-after", "0")])
        return Answer(204)

    await stream(gateway, name)
    await stream(gateway, f"{name}_DLQ", subjects=[f"dlq.{name}"])
    await publish(nc, f"{name}.orders", count, **{"Order-Region": "eu"})
    async with PushApp(picky) as app, AckWatch.on(nc, name, "push") as watch:
        await subscribe(
            gateway,
            name,
            endpoint=app.url,
            concurrency=32,
            dead_letter={"subject": f"dlq.{name}"},
            consumer_config={"ack_wait": "5s", "max_deliver": 3},
        )
        await drained(gateway, name, "push", timeout=40)
        assert unanswered(app, count) == sorted(poison)
        assert acked_only_after_2xx(app, watch) == []
    letters = await stored(nc, f"{name}_DLQ")
    by_seq = {int(m.headers["Nats-Dlq-Sequence"]): m for m in letters}
    assert set(by_seq) == poison and len(letters) == len(poison)
    for seq, letter in by_seq.items():
        headers = letter.headers
        assert headers["Nats-Dlq-Reason"] == "max_deliver (3) reached: HTTP 500", headers
        assert headers["Nats-Dlq-Stream"] == name
        assert headers["Nats-Dlq-Subject"] == f"{name}.orders"
        assert headers["Nats-Dlq-Delivered"] == "3"
        assert headers["Nats-Msg-Id"] == f"{name}:{seq}"
        assert headers["Order-Region"] == "eu"  # the message's own headers go along
        assert letter.data == f"m{seq - 1}".encode()
    assert sorted(r.delivered for r in app.received if r.seq == every) == [1, 2, 3]
    terms = [
        seq for (seq, _), events in watch.seen.items() for kind, *_ in events if kind == "+TERM"
    ]
    assert sorted(terms) == sorted(poison)
    seen = await state(gateway, name)
    assert seen["dead_lettered"] == seen["terminated"] == len(poison), seen


async def test_drop_and_refusals_with_and_without_a_dead_letter_subject(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    count = 300

    def answer(request: Received) -> Answer:
        if request.seq % 10 == 0:
            return Answer.json({"status": "DROP"})
        if request.seq % 10 == 5:
            return Answer(422)
        return Answer(200)

    await stream(gateway, name)
    await stream(gateway, f"{name}_DLQ", subjects=[f"dlq.{name}"])
    await publish(nc, f"{name}.orders", count)
    async with PushApp(answer) as app:
        # With a dead-letter subject: each lands there with its reason, then is terminated.
        await subscribe(gateway, name, endpoint=app.url, dead_letter={"subject": f"dlq.{name}"})
        await drained(gateway, name, "push", timeout=20)
        letters = {int(m.headers["Nats-Dlq-Sequence"]): m for m in await stored(nc, f"{name}_DLQ")}
        assert {s for s in letters if s % 10 == 0} == set(range(10, count + 1, 10))
        assert {s for s in letters if s % 10 == 5} == set(range(5, count + 1, 10))
        assert len(letters) == count // 5
        for seq, letter in letters.items():
            reason = "dropped by the application" if seq % 10 == 0 else "HTTP 422"
            assert letter.headers["Nats-Dlq-Reason"] == reason
            assert letter.headers["Nats-Dlq-Delivered"] == "1"
        assert {r.delivered for r in app.received} == {1}  # none retried
        # Without: terminated with the reason (the term carries it), nothing published.
        other = f"{name}b"
        await gateway.put(f"/v1/streams/{name}/consumers/{other}", json={"ack_wait": "5s"})
        async with AckWatch.on(nc, name, other) as watch:
            response = await gateway.put(
                f"/v1/subscriptions/{other}",
                json={"stream": name, "consumer": other, "endpoint": app.url},
            )
            assert response.status_code == 201, response.text
            await drained(gateway, name, other, timeout=20)
        terms = {
            seq: payload
            for (seq, _), events in watch.seen.items()
            for kind, payload, _ in events
            if kind == "+TERM"
        }
        assert terms == {
            **dict.fromkeys(range(10, count + 1, 10), b"+TERM dropped by the application"),
            **dict.fromkeys(range(5, count + 1, 10), b"+TERM HTTP 422"),
        }
    assert (await nc.jetstream().stream_info(f"{name}_DLQ")).state.messages == count // 5
    seen = await state(gateway, other)
    assert seen["terminated"] == count // 5 and seen["dead_lettered"] == 0, seen
    assert seen["acked"] == count - count // 5


# -- batches, CloudEvents, headers ---------------------------------------------------------


async def test_batches_with_a_status_per_message(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A batch is a JSON array of Message JSON; Dapr's bulk answer settles each message:
    SUCCESS acks, RETRY and a missing entry come back, DROP is terminated."""
    count = 2000
    await stream(gateway, name)
    await publish(nc, f"{name}.orders", count, **{"Order-Region": "eu"})
    acked: set[int] = set()

    def bulk(request: Received) -> Answer:
        statuses = []
        for item in request.json():
            seq = item["seq"]
            if seq % 97 == 0:
                status = "DROP"
            elif item["delivered"] == 1 and seq % 7 == 0:
                status = "RETRY"
            elif item["delivered"] == 1 and seq % 11 == 0:
                continue  # no status: retried
            else:
                status = "SUCCESS"
                acked.add(seq)
            statuses.append({"entryId": item["id"], "status": status})
        return Answer.json({"statuses": statuses}, headers=[("retry-after", "0")])

    async with PushApp(bulk) as app:
        await subscribe(
            gateway,
            name,
            endpoint=app.url,
            concurrency=4,
            batch=10,
            consumer_config={"ack_wait": "5s"},
        )
        await drained(gateway, name, "push", timeout=30)
    dropped = set(range(97, count + 1, 97))
    assert acked == set(range(1, count + 1)) - dropped
    first = app.received[0]
    assert first.headers["content-type"] == "application/json"
    assert first.headers["nats-stream"] == name and first.headers["nats-consumer"] == "push"
    item = first.json()[0]
    assert set(item) == {
        "id", "stream", "subject", "seq", "time", "headers", "data",
        "delivered", "consumer_seq", "pending",
    }  # fmt: skip
    assert item["id"] == f"{name}:{item['seq']}" and item["subject"] == f"{name}.orders"
    assert base64.b64decode(item["data"]) == f"m{item['seq'] - 1}".encode()
    assert item["headers"] == {"Order-Region": ["eu"]}
    sizes = [len(request.json()) for request in app.received]
    assert max(sizes) == 10 and sum(sizes) >= count
    retried = [i for r in app.received for i in r.json() if i["delivered"] > 1]
    assert {i["seq"] for i in retried} == {
        s for s in range(1, count + 1) if s % 97 and (s % 7 == 0 or s % 11 == 0)
    }
    seen = await state(gateway, name)
    assert seen["terminated"] == len(dropped) and seen["acked"] == len(acked), seen


async def test_cloudevents_and_plain_headers(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await stream(gateway, name)
    js = nc.jetstream()
    await js.publish(f"{name}.orders.1", b'{"id":1}', headers={"Content-Type": "application/json"})
    await js.publish(
        f"{name}.orders.2",
        b"two",
        headers={"Nats-Msg-Id": "order-2", "ce-type": "com.example.order", "ce-source": "/shop"},
    )
    structured = b'{"specversion":"1.0","id":"x","source":"/s","type":"t","data":{}}'
    await js.publish(
        f"{name}.orders.3",
        structured,
        headers={"Content-Type": "application/cloudevents+json", "X-Trace": "abc"},
    )
    await js.publish(
        f"{name}.orders.4",
        b"four",
        headers={"Host": "evil.example", "Content-Length": "1", "Nats-Sequence": "99", "A": "b"},
    )
    async with PushApp() as app:
        await subscribe(gateway, name, endpoint=app.url, format="cloudevents")
        await until(lambda: app.ok.total() == 4, 10, "4 messages delivered")
    one, two, three, four = sorted(app.received, key=lambda r: r.seq)
    h = one.headers
    assert one.body == b'{"id":1}' and h["content-type"] == "application/json"
    assert h["nats-subject"] == f"{name}.orders.1" and h["nats-stream"] == name
    assert h["nats-consumer"] == "push" and h["nats-sequence"] == "1"
    assert h["nats-delivered"] == "1" and h["nats-time"].endswith("Z")
    assert h["nats-msg-id"] == f"{name}:1"
    assert h["ce-specversion"] == "1.0" and h["ce-id"] == f"{name}:1"
    assert h["ce-source"] == f"/jsgw/streams/{name}"
    assert h["ce-type"] == "io.nats.jetstream.message"
    assert h["ce-time"] == h["nats-time"] and h["ce-subject"] == f"{name}.orders.1"
    h = two.headers
    assert h["content-type"] == "application/octet-stream"
    assert h["nats-msg-id"] == h["ce-id"] == "order-2"
    assert h["ce-type"] == "com.example.order" and h["ce-source"] == "/shop"
    h = three.headers  # a structured CloudEvent: as it is
    assert three.body == structured and h["content-type"] == "application/cloudevents+json"
    assert "ce-id" not in h and "ce-specversion" not in h and h["x-trace"] == "abc"
    h = four.headers  # framing fields and the gateway's own never come from the message
    assert h["host"].startswith("127.0.0.1:") and h["content-length"] == "4"
    assert h["nats-sequence"] == "4" and h["a"] == "b"
    assert h["user-agent"].startswith("jsgw/")


# -- the API -------------------------------------------------------------------------------


async def test_the_endpoint_allowlist(gateway: httpx.AsyncClient, name: str) -> None:
    await stream(gateway, name)
    hostile = [
        "http://127.0.0.1.evil.example/hook",
        "http://evil.example/hook",
        "http://127.0.0.1@evil.example/hook",
        "http://user:pw@127.0.0.1/hook",
        "https://127.0.0.1/hook",  # not the scheme of any prefix
        "http://2130706433/hook",  # 127.0.0.1, spelt otherwise
        "http://[::1]/hook",
        "http://127.0.0.1/a/../../admin",
        "http://127.0.0.1/a/%2e%2e/admin",
        "http://127.0.0.1\\@evil.example/",
        "http://127.0.0.1 /hook",
        "http://127.0.0.1/hook#frag",
        "ftp://127.0.0.1/hook",
        "/hook",
        "http://127.0.0.1:99999/hook",
    ]
    for endpoint in hostile:
        body = {"stream": name, "consumer": "push", "endpoint": endpoint}
        response = await gateway.put(f"/v1/subscriptions/{name}", json=body)
        problem(response, 400, "subscription.endpoint_not_allowed")
    problem(await gateway.get(f"/v1/subscriptions/{name}"), 404, "subscription.not_found")
    assert (await gateway.get("/v1/subscriptions")).json() == {"subscriptions": []}
    # Nothing stored, nothing made: no consumer, no bucket.
    problem(await gateway.get(f"/v1/streams/{name}/consumers/push"), 404)
    problem(await gateway.get(f"/v1/kv/subs_{name}"), 404)
    # Allowed: any port of an allowed host, and the host in any case.
    for endpoint in ("http://LOCALHOST:3000/hook", "http://127.0.0.1/"):
        body = {"stream": name, "consumer": "push", "endpoint": endpoint}
        response = await gateway.put(f"/v1/subscriptions/{name}", json=body)
        assert response.status_code in (200, 201), response.text


async def test_subscriptions_deleted_while_messages_flow_stop_and_the_gateway_with_them(
    nats_server: EmbeddedServer, nc: nats.NATS, tmp_path: Path, name: str
) -> None:
    """Each subscription is deleted while its consumer has messages coming (a publisher
    floods the stream): once the DELETE is answered and the POSTs under way have had their
    grace, the application hears nothing more from it, and SIGTERM then stops the gateway
    within its grace. A runner's task used to miss the cancel now and then (a message arriving
    in the same turn of the loop), and the gateway's shutdown then waited for it forever."""
    port = free_port()
    settings = {
        "JSGW_NATS_URL": nats_server.url,
        "JSGW_PORT": str(port),
        "JSGW_SUBSCRIPTIONS_BUCKET": f"subs_{name}",
        "JSGW_PUSH_SHUTDOWN_GRACE": "1",
        "JSGW_ACCESS_LOG": "false",
        "JSGW_DATA_DIR": str(tmp_path / "data"),
    }
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "gateway.log"
    subscriptions = 20
    flooding = True

    async def flood() -> None:
        sent = 0
        while flooding:
            await nc.publish(f"{name}.{sent % 10}", b"x")
            sent += 1
            if sent % 100 == 0:
                await asyncio.sleep(0.001)

    with jsgw_serve(settings, log, ready=f"{url}/readyz") as process:
        async with httpx.AsyncClient(base_url=url, timeout=30) as gateway, PushApp() as app:
            await stream(gateway, name, max_msgs=2000, storage="memory")
            publisher = asyncio.create_task(flood())
            try:
                for i in range(subscriptions):
                    endpoint = f"{app.url}/{i}"
                    await subscribe(
                        gateway, f"{name}_{i}", stream=name, consumer=f"c{i}", endpoint=endpoint
                    )
                    await until(
                        lambda i=i: any(r.path == f"/hook/{i}" for r in app.received),
                        10,
                        f"subscription {i} delivering",
                    )
                    deleted = await gateway.delete(f"/v1/subscriptions/{name}_{i}")
                    assert deleted.status_code == 204, deleted.text
                await asyncio.sleep(2.0)  # the POSTs under way have a grace of 1 s
                heard = len(app.received)
                await asyncio.sleep(2.0)
                late = sorted({r.path for r in app.received[heard:]})
                assert not late, f"deleted subscriptions still delivering to {late}"
            finally:
                flooding = False
                await publisher
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the gateway did not stop within 10 s of SIGTERM:\n{log.read_text()}")
        assert "Application shutdown complete" in log.read_text()


async def test_subscription_api_errors(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await stream(gateway, name)
    url = "http://127.0.0.1:9/hook"
    problem(await gateway.get("/v1/subscriptions/a.b"), 400, "subscription.name_invalid")
    problem(await gateway.delete(f"/v1/subscriptions/{name}"), 404, "subscription.not_found")
    problem(await gateway.post(f"/v1/subscriptions/{name}/pause"), 404)
    base = {"stream": name, "consumer": "c", "endpoint": url}
    for extra, status, code in [
        ({"batch": 2, "format": "cloudevents"}, 400, "request.invalid"),
        ({"concurrency": 0}, 400, "request.invalid"),
        ({"concurrency": 1025}, 400, "request.invalid"),
        ({"timeout": "2h"}, 400, "request.invalid"),
        ({"format": "xml"}, 400, "request.invalid"),
        ({"dead_letter": {"subject": "a.*"}}, 400, "request.invalid"),
        ({"dead_letter": {"subject": "$JS.API.x"}}, 400, "request.invalid"),
        ({"consumer_config": {"name": "d"}}, 400, "request.invalid"),
        ({"consumer_config": {"ack_policy": "none"}}, 400, "subscription.invalid"),
        ({"ordered": True, "consumer_config": {"max_ack_pending": 5}}, 400, "subscription.invalid"),
        ({"stream": "NOPE"}, 404, "stream.not_found"),
    ]:
        response = await gateway.put(f"/v1/subscriptions/{name}", json={**base, **extra})
        problem(response, status, code)
    # An existing consumer an ordered subscription cannot use.
    await gateway.put(f"/v1/streams/{name}/consumers/plain", json={})
    body = {"stream": name, "consumer": "plain", "endpoint": url, "ordered": True}
    problem(
        await gateway.put(f"/v1/subscriptions/{name}", json=body),
        409,
        "subscription.consumer_mismatch",
    )
    # An ordered one makes its consumer with what it needs, and forces one at a time.
    body = {"stream": name, "consumer": "ord", "endpoint": url, "ordered": True,
            "concurrency": 50, "consumer_config": {"priority_timeout": "5s"}}  # fmt: skip
    made = await gateway.put(f"/v1/subscriptions/{name}", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["config"]["concurrency"] == 1 and made.json()["config"]["batch"] == 1
    config = (await consumer_state(gateway, name, "ord"))["config"]
    assert config["priority_policy"] == "pinned_client" and config["priority_groups"] == ["jsgw"]
    assert config["max_ack_pending"] == 1 and config["priority_timeout"] == 5
    # Updated: 200, the same name now on another consumer.
    body = {"stream": name, "consumer": "plain", "endpoint": url, "timeout": "5s"}
    updated = await gateway.put(f"/v1/subscriptions/{name}", json=body)
    assert updated.status_code == 200, updated.text
    assert updated.json()["config"]["timeout"] == 5
    listed = (await gateway.get("/v1/subscriptions")).json()["subscriptions"]
    assert [s["config"]["consumer"] for s in listed] == ["plain"]
    # Deleted, and its consumer with it when asked.
    deleted = await gateway.delete(f"/v1/subscriptions/{name}", params={"delete_consumer": "true"})
    assert deleted.status_code == 204
    problem(await gateway.get(f"/v1/streams/{name}/consumers/plain"), 404)
    problem(await gateway.get(f"/v1/subscriptions/{name}"), 404, "subscription.not_found")


async def test_pause_and_resume(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    """A pause stops every delivery at once (the consumer's pause); what was out is still
    answered and acked; a resume delivers the rest."""
    count = 400
    await stream(gateway, name)
    await publish(nc, f"{name}.orders", count)
    async with PushApp(lambda _: Answer(204, delay=0.1)) as app:
        await subscribe(gateway, name, endpoint=app.url, concurrency=20)
        await until(lambda: app.ok.total() >= 50, 20, "50 messages delivered")
        paused = await gateway.post(f"/v1/subscriptions/{name}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["state"]["paused"] is True
        server = await consumer_state(gateway, name, "push")
        assert server["paused"] is True and server["pause_remaining"] > 10**9
        at_pause = len(app.received)
        # What was out is finished and acked; nothing more comes.
        await until(lambda: app.in_flight == 0, 5, "the requests under way answered")
        await drained_ack_pending(gateway, name)
        settled = len(app.received)
        assert settled - at_pause <= 20  # at most what the process held when it paused
        await asyncio.sleep(1.5)
        assert len(app.received) == settled
        resumed = await gateway.post(f"/v1/subscriptions/{name}/resume")
        assert resumed.status_code == 200 and resumed.json()["state"]["paused"] is False
        await drained(gateway, name, "push", timeout=30)
    assert unanswered(app, count) == []
    # Paused for a while, then resumed by itself.
    timed = await gateway.post(f"/v1/subscriptions/{name}/pause", json={"until": "1h"})
    assert timed.json()["state"]["paused"] is True
    problem(
        await gateway.post(f"/v1/subscriptions/{name}/pause", json={"until": "soon"}),
        400,
        "consumer.pause_invalid",
    )


async def drained_ack_pending(gateway: httpx.AsyncClient, name: str) -> None:
    async def settled() -> bool:
        return (await consumer_state(gateway, name, "push"))["num_ack_pending"] == 0

    await until(settled, 10, "no message out unacked")


POLICY = """
tokens:
  - name: admin
    token: "push-admin-token-0123456789"
    rules:
      - {{resource: "stream:*", actions: [read, write, admin]}}
      - {{resource: "consumer:*/*", actions: [admin, consume]}}
  - name: reader
    token: "push-reader-token-0123456789"
    rules:
      - {{resource: "consumer:{s}/push", actions: [consume]}}
  - name: other
    token: "push-other-token-0123456789"
    rules:
      - {{resource: "stream:{s}", actions: [read]}}
      - {{resource: "consumer:{s}/other", actions: [admin]}}
  - name: nothing
    token: "push-nothing-token-0123456789"
    rules:
      - {{resource: "stream:{s}", actions: [read]}}
  - name: confined
    token: "push-confined-token-0123456789"
    rules:
      - {{resource: "stream:{s}", actions: [read]}}
      - {{resource: "stream:{s}/{s}.secret", actions: []}}
      - {{resource: "consumer:{s}/*", actions: [admin]}}
"""


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer push-{who}-token-0123456789"}


async def test_admin_on_the_consumer_is_needed(
    nats_server: EmbeddedServer, tmp_path: Path, name: str
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(POLICY.format(s=name))
    settings = gateway_settings(
        nats_server.url, auth_file=auth, subscriptions_bucket=f"subs_{name}"
    )
    url = "http://127.0.0.1:9/hook"
    body = {"stream": name, "consumer": "push", "endpoint": url}
    path = f"/v1/subscriptions/{name}"
    async with running_gateway(settings) as gw:
        admin = bearer("admin")
        made = await gw.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]}, headers=admin)
        assert made.status_code == 201
        # Decided from the head: no admin on any consumer, not even the body is read.
        for who in ("reader", "nothing"):
            problem(await gw.put(path, content=b"{not json", headers=bearer(who)), 403)
            problem(await gw.put(path, json=body, headers=bearer(who)), 403)
        # Admin on another consumer: the subscription's own is checked once the body is read.
        problem(await gw.put(path, json=body, headers=bearer("other")), 403)
        # A consumer reaching subjects a deny rule takes from the token: as for consuming it.
        problem(await gw.put(path, json=body, headers=bearer("confined")), 403, "auth.forbidden")
        confined_body = {**body, "consumer_config": {"filter_subject": f"{name}.public.>"}}
        allowed = await gw.put(path, json=confined_body, headers=bearer("confined"))
        assert allowed.status_code == 201, allowed.text
        # Now it delivers push: changing it needs admin on push too (other has it on other).
        moved = {**body, "consumer": "other"}
        problem(await gw.put(path, json=moved, headers=bearer("other")), 403)
        # Seen by who may consume or administer its consumer, and no one else.
        listed = await gw.get("/v1/subscriptions", headers=bearer("reader"))
        assert [s["name"] for s in listed.json()["subscriptions"]] == [name]
        assert (await gw.get(path, headers=bearer("reader"))).status_code == 200
        listed = await gw.get("/v1/subscriptions", headers=bearer("other"))
        assert listed.json()["subscriptions"] == []
        problem(await gw.get(path, headers=bearer("other")), 403)
        for call in (
            gw.delete(path, headers=bearer("reader")),
            gw.delete(path, headers=bearer("other")),
        ):
            problem(await call, 403)
        problem(await gw.post(f"{path}/pause", headers=bearer("other")), 403)
        problem(await gw.put(path, json=body), 401)
        assert (await gw.delete(path, headers=admin)).status_code == 204


async def test_subscriptions_declared_in_a_file(
    nats_server: EmbeddedServer, nc: nats.NATS, tmp_path: Path, name: str
) -> None:
    count = 500
    async with PushApp() as app:
        declared = tmp_path / "subscriptions.yaml"
        declared.write_text(
            f"""
- name: {name}
  stream: {name}
  consumer: filed
  endpoint: {app.url}
  concurrency: 4
  consumer_config: {{ack_wait: 10s, max_deliver: 5, filter_subject: "{name}.>"}}
"""
        )
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name}.>"])
        await publish(nc, f"{name}.orders", count)
        settings = gateway_settings(
            nats_server.url, subscriptions=declared, subscriptions_bucket=f"subs_{name}"
        )
        async with running_gateway(settings) as gw:
            # Delivering from the start: its consumer made from consumer_config.
            await until(lambda: app.ok.total() > 0, 10, "a first delivery")
            await drained(gw, name, "filed", timeout=30)
            assert unanswered(app, count) == []
            config = (await consumer_state(gw, name, "filed"))["config"]
            assert config["max_deliver"] == 5 and config["ack_wait"] == 10
            listed = (await gw.get("/v1/subscriptions")).json()["subscriptions"]
            assert [(s["name"], s["state"]["source"]) for s in listed] == [(name, "file")]
            assert listed[0]["state"]["acked"] == count
            body = {"stream": name, "consumer": "filed", "endpoint": app.url}
            path = f"/v1/subscriptions/{name}"
            problem(await gw.put(path, json=body), 409, "subscription.declared_in_file")
            problem(await gw.delete(path), 409, "subscription.declared_in_file")
            # Nothing of it was stored.
            problem(await gw.get(f"/v1/kv/subs_{name}"), 404)


async def test_a_stored_subscription_outside_the_allowlist_is_not_delivered(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Whoever can write the bucket directly cannot point the gateway elsewhere: what it
    loads is checked as a PUT is, and shown refused."""
    await stream(gateway, name)
    await subscribe(gateway, name, endpoint="http://127.0.0.1:9/hook")  # (makes the bucket)
    forged = {"stream": name, "consumer": "forged", "endpoint": "http://169.254.169.254/"}
    written = await gateway.put(f"/v1/kv/{BUCKET}/keys/{name}forged", content=orjson.dumps(forged))
    assert written.status_code == 200, written.text
    broken = await gateway.put(f"/v1/kv/{BUCKET}/keys/{name}broken", content=b"{not json")
    assert broken.status_code == 200

    async def refused() -> bool:
        listed = (await gateway.get("/v1/subscriptions")).json()["subscriptions"]
        states = {item["name"]: item["state"] for item in listed}
        return {f"{name}forged", f"{name}broken"} <= states.keys()

    await until(refused, 10, "the forged entries loaded")
    shown = (await gateway.get(f"/v1/subscriptions/{name}forged")).json()
    assert (
        shown["state"]["running"] is False and "JSGW_PUSH_ALLOWED_URLS" in shown["state"]["refused"]
    )
    assert shown["config"]["endpoint"] == "http://169.254.169.254/"
    broken_state = (await gateway.get("/v1/subscriptions")).json()["subscriptions"]
    assert any("not JSON" in (s["state"].get("refused") or "") for s in broken_state)
    problem(await gateway.get(f"/v1/streams/{name}/consumers/forged"), 404)  # nothing pulled
