"""Publishing through the gateway while the stream leader of an R3 stream is killed and restarted.

Jepsen's rule for NATS: a write acknowledged to the client must survive, and a timeout is
"unknown", not "failed". The gateway answers 2xx only after the PubAck and 504
``nats.outcome_unknown`` when the PubAck did not come in time; a retry with the same
``Nats-Msg-Id`` must then be stored at most once. The check reads the whole stream back with
nats-py, independently of the gateway.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import pytest

from tests.cluster import Cluster
from tests.faults.history import History, stored_messages
from tests.faults.leader import kill_and_restart_leader
from tests.helpers import gateway_settings, served_gateway

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
