"""Publishing through the gateway while the stream leader of an R3 stream is killed and restarted.

Jepsen's rule for NATS: a write acknowledged to the client must survive, and a timeout is
"unknown", not "failed". The gateway answers 2xx only after the PubAck and 504
``nats.outcome_unknown`` when the PubAck did not come in time; a retry with the same
``Nats-Msg-Id`` must then be stored at most once. The check reads the whole stream back with
nats-py, independently of the gateway.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import nats
import nats.errors
import pytest

from tests.cluster import Cluster
from tests.faults.history import History, stored_messages
from tests.faults.leader import kill_and_restart_leader
from tests.helpers import gateway_settings, problem, served_gateway

pytestmark = pytest.mark.slow

WRITERS = 4
BURST = 32


@dataclass
class Publishes:
    acked: dict[str, int] = field(default_factory=dict)  # Nats-Msg-Id -> acked seq
    duplicate_first_acks: list[str] = field(default_factory=list)
    unknown: set[str] = field(default_factory=set)  # 504 nats.outcome_unknown
    refused: set[str] = field(default_factory=set)  # 503: not stored (nothing sent, no leader)
    other: set[str] = field(default_factory=set)


async def publish(
    http: httpx.AsyncClient, subject: str, msg_id: str, history: History, out: Publishes
) -> int:
    """One publish with a fresh Nats-Msg-Id, its outcome filed under that id."""
    started = time.monotonic()
    response = await http.post(
        f"/v1/publish/{subject}", content=msg_id.encode(), headers={"Nats-Msg-Id": msg_id}
    )
    call = history.record("publish", started, response)
    if response.status_code == 200:
        ack = response.json()
        out.acked[msg_id] = ack["seq"]
        if ack["duplicate"]:  # a fresh id can only be a duplicate of itself: a bug
            out.duplicate_first_acks.append(msg_id)
    elif call.code == "nats.outcome_unknown":
        out.unknown.add(msg_id)
    elif response.status_code == 503:
        out.refused.add(msg_id)
    else:
        out.other.add(msg_id)
    return response.status_code


async def writer(
    http: httpx.AsyncClient,
    stream: str,
    name: str,
    stop: asyncio.Event,
    history: History,
    out: Publishes,
) -> None:
    index = 0
    while not stop.is_set():
        status = await publish(http, f"{stream}.{name}", f"{name}-{index}", history, out)
        index += 1
        if status != 200:
            await asyncio.sleep(0.05)


async def test_acked_publishes_survive_a_leader_kill(healed: Cluster) -> None:
    cluster = healed
    stream = f"P{uuid.uuid4().hex[:10]}"
    settings = gateway_settings(cluster.urls[0], nats_url=cluster.urls, request_timeout=2.0)
    history = History()
    pubs = Publishes()
    with served_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:
            created = await http.put(
                f"/v1/streams/{stream}",
                json={"subjects": [f"{stream}.>"], "num_replicas": 3, "duplicate_window": "2m"},
            )
            assert created.status_code == 201, created.text
            await cluster.wait_stream_current(stream)

            stop = asyncio.Event()
            writers = [
                asyncio.create_task(writer(http, stream, f"w{w}", stop, history, pubs))
                for w in range(WRITERS)
            ]

            async def burst() -> None:
                # Publishes in flight at the moment of the kill: the likeliest to be unknown.
                for i in range(BURST):
                    writers.append(
                        asyncio.create_task(
                            publish(http, f"{stream}.burst", f"burst-{i}", history, pubs)
                        )
                    )
                await asyncio.sleep(0.02)

            await asyncio.sleep(1.0)
            fault = await kill_and_restart_leader(
                cluster, http, stream, down=2.0, pause=1.0, just_before=burst
            )
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*writers), 20)

            # Every outcome_unknown publish, retried with its id once the cluster is whole.
            retried: dict[str, int] = {}
            stored_before = 0  # retries answered as duplicates: the first attempt was stored
            for msg_id in sorted(pubs.unknown):
                subject = f"{stream}.{msg_id.split('-')[0]}"
                again = await http.post(
                    f"/v1/publish/{subject}",
                    content=msg_id.encode(),
                    headers={"Nats-Msg-Id": msg_id},
                )
                assert again.status_code == 200, (msg_id, again.status_code, again.text)
                retried[msg_id] = again.json()["seq"]
                stored_before += again.json()["duplicate"]

    summary = f"{fault}\n{history.summary()}"
    assert not history.unexpected(), f"unexpected statuses:\n{summary}"
    assert not pubs.other, f"publishes refused for another reason: {sorted(pubs.other)}\n{summary}"
    assert not pubs.duplicate_first_acks, pubs.duplicate_first_acks
    assert all(c.retry_after for c in history.calls if c.status == 503), summary
    # The workload spanned the fault: acks before the kill and after the restart.
    acked_calls = [c for c in history.calls if c.status == 200]
    assert any(c.ended < fault.killed_at for c in acked_calls), summary
    assert any(c.started > fault.restarted_at for c in acked_calls), summary
    # Publishes held by the stalled leader when it died were sent and never confirmed.
    assert pubs.unknown, f"no publish was answered outcome_unknown\n{summary}"

    stored: dict[str, list[int]] = defaultdict(list)
    for message in await stored_messages(cluster.urls, stream):
        msg_id = message["headers"].get("Nats-Msg-Id")
        assert message["data"] == (msg_id or "").encode(), message
        stored[msg_id].append(message["seq"])

    lost = {i: seq for i, seq in pubs.acked.items() if stored.get(i) != [seq]}
    assert not lost, f"acked publishes missing or moved (id: acked seq): {lost}\n{summary}"
    twice = {i: seqs for i, seqs in stored.items() if len(seqs) > 1}
    assert not twice, f"stored more than once: {twice}"
    for msg_id, seq in retried.items():
        assert stored.get(msg_id) == [seq], (msg_id, seq, stored.get(msg_id))
    stored_but_refused = {i: stored[i] for i in pubs.refused if i in stored}
    assert not stored_but_refused, f"answered 503 but stored: {stored_but_refused}"
    assert set(stored) == set(pubs.acked) | set(retried), "a message nobody published"
    print(
        f"\n{summary}\nacked={len(pubs.acked)} unknown={len(pubs.unknown)} "
        f"(of which stored by the first attempt: {stored_before}) "
        f"refused={len(pubs.refused)} stored={sum(map(len, stored.values()))}"
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def step_down(cluster: Cluster, nc: nats.NATS, stream: str) -> None:
    """The stream's leader steps down (once its replicas are current: one can take over)."""
    await cluster.wait_stream_current(stream)
    moved = await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
    assert json.loads(moved.data).get("success"), moved.data


async def no_responders(http: httpx.AsyncClient, operation: str) -> float:
    """How many of the gateway's NATS requests for ``operation`` met no responders."""
    found = re.search(
        r'^jsgw_nats_request_errors_total\{(?=[^}]*kind="no_responders")'
        rf'(?=[^}}]*operation="{re.escape(operation)}")[^}}]*\}} (\S+)$',
        (await http.get("/metrics")).text,
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


@contextlib.asynccontextmanager
async def gateway_on_one_node(
    cluster: Cluster, created: str, config: dict
) -> AsyncIterator[tuple[httpx.AsyncClient, nats.NATS]]:
    """A gateway connected to the first node only (a new leader's subscription has to reach
    that node before it takes a write), ``created`` made through it with ``config``, and a
    nats-py connection to the cluster."""
    settings = gateway_settings(cluster.urls[0], request_timeout=2.0)
    nc = await nats.connect(cluster.urls, connect_timeout=2)
    try:
        with served_gateway(settings) as base:
            async with httpx.AsyncClient(base_url=base, timeout=15) as http:
                made = await http.put(created, json=config)
                assert made.status_code == 201, made.text
                yield http, nc
    finally:
        await nc.close()


async def publish_as_told(http: httpx.AsyncClient, path: str, data: bytes) -> httpx.Response:
    """A publish with a Nats-Msg-Id, sent again with it when answered 504
    ``nats.outcome_unknown`` (as the problem tells a client to). Right after a stepdown, the
    deposed leader's subscription may still reach the gateway's server for a moment: a publish
    it takes is dropped, unanswered, which nothing but a timeout can tell."""
    headers = {"Nats-Msg-Id": f"m-{uuid.uuid4().hex}"}
    published = await http.post(path, content=data, headers=headers)
    if published.status_code == 504 and published.json()["code"] == "nats.outcome_unknown":
        published = await http.post(path, content=data, headers=headers)
    return published


async def test_publishes_right_after_a_leader_stepdown_are_stored(healed: Cluster) -> None:
    """The leader that steps down takes the stream's subscription with it, and the new
    leader's reaches the gateway's server a moment later: a publish in between meets no
    responders. The gateway sends it again (nothing was stored) instead of refusing it."""
    stream = f"P{uuid.uuid4().hex[:10]}"
    config = {"subjects": [f"{stream}.>"], "num_replicas": 3}
    async with gateway_on_one_node(healed, f"/v1/streams/{stream}", config) as (http, nc):
        for i in range(5):
            await step_down(healed, nc, stream)
            published = await publish_as_told(http, f"/v1/publish/{stream}.x", b"m%d" % i)
            assert published.status_code == 200, (i, published.text)
            assert published.json()["seq"] == i + 1, published.json()
        # The window with nobody to take a write was met (at least once in all).
        assert await no_responders(http, "publish") > 0
    stored = await stored_messages(healed.urls, stream)
    assert [m["data"] for m in stored] == [b"m%d" % i for i in range(5)], stored


async def test_a_publish_nobody_takes_for_long_is_refused_after_two_retries(
    healed: Cluster,
) -> None:
    """The only server of an R1 stream is down: the publish is sent three times in all, 250 ms
    apart, then answered 503 ``stream.unavailable`` with Retry-After, within its time."""
    cluster = healed
    stream = f"P{uuid.uuid4().hex[:10]}"
    nc = await nats.connect(cluster.urls, connect_timeout=2)
    try:
        config = {"name": stream, "subjects": [f"{stream}.>"], "num_replicas": 1}
        created = json.loads(
            (
                await nc.request(
                    f"$JS.API.STREAM.CREATE.{stream}", json.dumps(config).encode(), timeout=5
                )
            ).data
        )
        leader = created["cluster"]["leader"]
        other = next(name for name in cluster.nodes if name != leader)
        await cluster.kill(leader)
        # The cluster still knows the stream (should the meta leader have gone too, once a
        # new one is elected): the gateway can tell "no leader" from "no stream".
        deadline = time.monotonic() + 30
        while True:
            try:
                names = json.loads(
                    (
                        await nc.request(
                            "$JS.API.STREAM.NAMES",
                            json.dumps({"subject": f"{stream}.x"}).encode(),
                            timeout=2,
                        )
                    ).data
                )
                if names.get("streams") == [stream]:
                    break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                pass
            assert time.monotonic() < deadline, "the cluster did not answer STREAM.NAMES"
            await asyncio.sleep(0.2)
    finally:
        await nc.close()

    settings = gateway_settings(cluster.nodes[other].url, request_timeout=2.0)
    with served_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:
            before = await no_responders(http, "publish")
            started = time.monotonic()
            refused = await http.post(f"/v1/publish/{stream}.x", content=b"m")
            took = time.monotonic() - started
            after = await no_responders(http, "publish")
    problem(refused, 503, "stream.unavailable")
    assert refused.headers["retry-after"] == "1"
    assert after - before == 3, (before, after)
    assert 0.5 <= took < 2.0 + 0.5, took


async def test_a_publish_when_the_stream_and_meta_leader_crashes_is_answered_in_time(
    healed: Cluster,
) -> None:
    """The node that crashes led the stream and the JetStream meta group: nothing answers
    "does a stream take this subject" until a new meta leader is elected. The question waits
    no longer than a liveness probe, and the publish is sent again in the time left: it is
    answered (stored, or 503 to retry) well within its request timeout, not at its end."""
    cluster = healed
    stream = f"P{uuid.uuid4().hex[:10]}"
    nc = await nats.connect(cluster.urls, connect_timeout=2)
    try:
        config = {"name": stream, "subjects": [f"{stream}.>"], "num_replicas": 3}
        await nc.request(f"$JS.API.STREAM.CREATE.{stream}", json.dumps(config).encode(), timeout=5)
        meta = cluster.meta_leader()
        for _ in range(10):  # (the stream's leader moved to the meta leader's node)
            info = await cluster.wait_stream_current(stream)
            if info["cluster"]["leader"] == meta:
                break
            moved = await nc.request(
                f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                json.dumps({"placement": {"preferred": meta}}).encode(),
                timeout=5,
            )
            assert json.loads(moved.data).get("success"), moved.data
        else:
            raise AssertionError(f"the leader of {stream} did not move to {meta}")
    finally:
        await nc.close()
    other = next(name for name in cluster.nodes if name != meta)
    settings = gateway_settings(cluster.nodes[other].url, request_timeout=5.0)
    with served_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:
            await cluster.kill(meta)
            started = time.monotonic()
            answer = await http.post(f"/v1/publish/{stream}.x", content=b"m")
            took = time.monotonic() - started
    assert answer.status_code in (200, 503), answer.text
    if answer.status_code == 503:
        problem(answer, 503, "stream.unavailable")
        assert answer.headers["retry-after"] == "1"
    # A probe's second for the question, the publish sent again twice 250 ms apart.
    assert took < 2.5, (took, answer.text)


async def test_an_object_put_right_after_a_leader_stepdown_is_stored(healed: Cluster) -> None:
    """An object's first chunk and its metadata are sent again when nobody takes them."""
    bucket = f"o{uuid.uuid4().hex[:10]}"
    async with gateway_on_one_node(healed, f"/v1/obj/{bucket}", {"replicas": 3}) as (http, nc):
        for i in range(3):
            await step_down(healed, nc, f"OBJ_{bucket}")
            body = bytes([i]) * 300_000
            put = await http.put(f"/v1/obj/{bucket}/objects/f{i}", content=body)
            if put.status_code == 504:  # (a chunk the deposed leader took: see publish_as_told)
                put = await http.put(f"/v1/obj/{bucket}/objects/f{i}", content=body)
            assert put.status_code in (200, 201), (i, put.text)
            got = await http.get(f"/v1/obj/{bucket}/objects/f{i}")
            assert got.status_code == 200 and got.content == body, (i, got.status_code)
        assert await no_responders(http, "obj.put") > 0


@pytest.mark.server("2.12")
async def test_an_atomic_batch_right_after_a_leader_stepdown_is_stored(healed: Cluster) -> None:
    """A batch whose commit nobody took stored nothing: it is sent again under a new id."""
    stream = f"P{uuid.uuid4().hex[:10]}"
    config = {"subjects": [f"{stream}.>"], "num_replicas": 3, "allow_atomic": True}
    async with gateway_on_one_node(healed, f"/v1/streams/{stream}", config) as (http, nc):
        for i in range(3):
            await step_down(healed, nc, stream)
            messages = [
                {"subject": f"{stream}.x", "data": b64(b"%d.%d" % (i, j))} for j in range(3)
            ]
            stored = await http.post("/v1/publish?atomic=true", json={"messages": messages})
            if stored.status_code == 504 and stored.json()["code"] == "nats.outcome_unknown":
                # (a commit the deposed leader took: see publish_as_told. A batch has no
                # Nats-Msg-Id to send it again with, so a client reads the stream first, as
                # this does, and sends the batch again only if it is not there.)
                if len(await stored_messages(healed.urls, stream)) == 3 * i:
                    stored = await http.post("/v1/publish?atomic=true", json={"messages": messages})
                else:
                    continue
            assert stored.status_code == 200, (i, stored.text)
            assert stored.json()["seq"] == 3 * (i + 1), stored.json()
        assert await no_responders(http, "publish_atomic") > 0
    found = await stored_messages(healed.urls, stream)
    assert [m["data"] for m in found] == [b"%d.%d" % (i, j) for i in range(3) for j in range(3)]


async def test_acks_right_after_a_consumer_leader_stepdown_are_not_called_deleted(
    healed: Cluster,
) -> None:
    """Only the consumer's leader takes its acks: right after it steps down, an ack meets no
    responders. It is sent again (an ack is safe to send again), and one still not taken is
    not answered "consumer deleted" while the consumer is there."""
    stream = f"P{uuid.uuid4().hex[:10]}"
    config = {"subjects": [f"{stream}.>"], "num_replicas": 3}
    async with gateway_on_one_node(healed, f"/v1/streams/{stream}", config) as (http, nc):
        consumers = f"/v1/streams/{stream}/consumers"
        made = await http.put(f"{consumers}/w", json={"ack_policy": "explicit"})
        assert made.status_code in (200, 201), made.text
        codes: dict[str | None, int] = {}
        for _ in range(5):
            for _ in range(3):
                assert (await http.post(f"/v1/publish/{stream}.x", content=b"m")).is_success
            fetched = await http.post(f"{consumers}/w/fetch", json={"max_messages": 3})
            tokens = [{"token": m["ack_token"]} for m in fetched.json()["messages"]]
            assert len(tokens) == 3, fetched.text
            await consumer_current(nc, stream, "w")
            moved = await nc.request(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.w", b"", timeout=5)
            assert json.loads(moved.data).get("success"), moved.data
            acked = await http.post(f"{consumers}/w/ack", json={"acks": tokens})
            assert acked.status_code == 200, acked.text
            for result in acked.json()["results"]:
                code = (result.get("error") or {}).get("code")
                codes[code] = codes.get(code, 0) + 1
        assert await no_responders(http, "consumer.ack") > 0  # the window was met
    assert "consumer.not_found" not in codes, codes
    assert codes.get(None, 0) >= 10, codes  # most acks confirmed


async def consumer_current(nc: nats.NATS, stream: str, name: str, timeout: float = 20) -> None:
    """Until the consumer has a leader and its replicas are current (one can take over)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await nc.request(f"$JS.API.CONSUMER.INFO.{stream}.{name}", b"", timeout=2)
            cluster = json.loads(reply.data).get("cluster") or {}
            replicas = cluster.get("replicas") or []
            if (
                cluster.get("leader")
                and len(replicas) == 2
                and all(r.get("current") for r in replicas)
            ):
                return
        except nats.errors.TimeoutError:
            pass
        assert time.monotonic() < deadline, f"consumer {name} did not get current"
        await asyncio.sleep(0.2)
