"""Network partitions between the gateway and a 3-node JetStream cluster, under load.

Each scenario builds the topology of tests/faults/netns.py (nodes, switch and a real
``jsgw serve`` in their own network namespaces), runs the clients of tests/faults/workload.py
against the gateway over HTTP (publishes, KV CAS counters, KV and Direct Get readers, a KV
watch and a consume stream over SSE), cuts links, heals them, reads back what was stored
with nats-py and checks it against what the clients were told:

- safety: no acked publish lost, no Nats-Msg-Id stored twice, no lost CAS update, no write
  stored although it was answered 412, no watch revision missed or repeated, no stored
  message never delivered to the consume stream;
- answers: only 2xx, a valid 412, or 503/504 problem+json, never later than the gateway's
  request timeout + 1.5 s;
- recovery: every request succeeds again within RECOVERY s of the heal (and, where a path to
  the cluster stays open, within STEADY s of the cut).

``JSGW_PARTITION_ROUNDS=N`` repeats each scenario N times; ``JSGW_PARTITION_FIGURES=<file>``
appends each run's figures there as a JSON line (bench/partitions.py prints them as a table).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.faults.netns import NODES, Partition
from tests.faults.workload import Figures, Workload

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("JSGW_PARTITION_ROUNDS", "1"))
RECOVERY = 15.0  # s from the heal until every request succeeds
STEADY = 5.0  # s from a cut that leaves a path until every request succeeds (issue: <= 5 s)
WARMUP = 3.0
ISOLATION = float(os.environ.get("JSGW_PARTITION_ISOLATION", "10"))  # scenario (b), s

rounds = pytest.mark.parametrize("round_", range(ROUNDS), ids=lambda r: f"round{r}")


def gateway_node(harness: Partition) -> str:
    """A node the gateway holds a connection to (the one with most)."""
    conns = harness.gateway_connections()
    return max(NODES, key=lambda n: conns.get(n, 0))


async def place_leaders(harness: Partition, load: Workload, node: str) -> None:
    """Every stream of the workload (and its consumer) led by ``node``."""
    for stream in load.streams:
        await harness.move_leader(stream, node)
    await harness.move_leader(load.stream, node, consumer=load.consumer)


async def scenario(
    harness: Partition,
    name: str,
    fault: Callable[[Workload, str], Awaitable[None]],
) -> tuple[Workload, Figures]:
    """Set up, load, run ``fault(load, leader)`` (which marks fault/heal in load.timeline and
    heals), keep the load on until it recovers, check."""
    load = Workload(harness.gateway_url, request_timeout=harness.request_timeout)
    await load.setup()
    for stream in load.streams:
        await harness.wait_stream_current(stream)
    leader = gateway_node(harness)
    await place_leaders(harness, load, leader)
    load.notes.append(f"leader {leader}; gateway connections {harness.gateway_connections()}")
    load.start()
    try:
        await asyncio.sleep(WARMUP)
        await fault(load, leader)
        assert load.timeline.heal_at is not None
        await load.until_recovered(load.timeline.heal_at, RECOVERY)
        figures = await load.check(harness, name)
    finally:
        harness.heal_all()
        await load.stop()
    print(f"\n{figures.table()}\n{figures.json_line()}")
    out = os.environ.get("JSGW_PARTITION_FIGURES")
    if out:
        with open(out, "a") as file:
            file.write(figures.json_line() + "\n")
    return load, figures


def verdict(harness: Partition, load: Workload, figures: Figures, *, steady: bool = False) -> None:
    """Assert every property at once; the message lists the broken ones with the figures."""
    broken = []
    for name in (
        "acked_lost",
        "duplicate_msg_ids",
        "duplicate_first_acks",
        "cas_lost",
        "refused_but_stored",
        "watch_missed",
        "watch_repeated",
        "consume_missing",
    ):
        if getattr(figures, name):
            broken.append(f"{name} = {getattr(figures, name)}")
    if figures.refused_but_stored_by_count and not figures.refused_but_stored:
        broken.append(f"refused_but_stored_by_count = {figures.refused_but_stored_by_count}")
    if figures.unexpected:
        broken.append(
            f"{figures.unexpected} answers other than 2xx / valid 412 / 503 / 504 problem"
        )
    if figures.slow_answers:
        broken.append(
            f"{figures.slow_answers} answers after the request timeout + margin "
            f"(max {figures.max_latency:.1f}s)"
        )
    if figures.heal_to_all_success is None or figures.heal_to_all_success > RECOVERY:
        broken.append(
            f"not recovered within {RECOVERY}s of the heal: {figures.heal_to_all_success}"
        )
    if steady and (figures.fault_to_steady is None or figures.fault_to_steady > STEADY):
        broken.append(
            f"requests kept failing during the cut although a node was reachable "
            f"(fault_to_steady = {figures.fault_to_steady}, bound {STEADY}s; "
            f"{figures.full_timeout_waits_late} waited the full timeout "
            f"more than 10 s into the cut)"
        )
    if broken:
        pytest.fail(
            f"{figures.scenario}: " + "; ".join(broken) + f"\n{figures.table()}\n"
            f"gateway log (tail):\n{harness.tail(harness.gateway_log, 15)}",
            pytrace=False,
        )


@rounds
async def test_gateway_cut_from_the_stream_leader(partition: Partition, round_: int) -> None:
    """(a) The gateway loses its link to the leader of every stream (a node it is connected
    to) for 12 s; the cluster stays whole, so requests must flow through the other nodes
    within STEADY s."""

    async def fault(load: Workload, leader: str) -> None:
        load.timeline.fault_at = load.timeline.mark(f"cut gw-{leader}")
        partition.cut("gw", leader)
        await asyncio.sleep(12)
        partition.heal("gw", leader)
        load.timeline.heal_at = load.timeline.mark("heal")

    load, figures = await scenario(partition, "a:gw-cut-from-leader", fault)
    verdict(partition, load, figures, steady=True)


@rounds
@pytest.mark.parametrize("partition_env", [{"JSGW_POOL_SIZE": "1"}], ids=["pool1"])
async def test_minority_leader_isolated_then_healed(partition: Partition, round_: int) -> None:
    """(b) The leader, the node of the gateway's only connection, loses the other two for ~10 s.

    The majority elects a new leader; the old one keeps its client links. After the heal
    both may answer one publish: a CAS write stored by the new leader must not be answered
    412 because the deposed one refused it.
    """

    async def fault(load: Workload, leader: str) -> None:
        # Healed ISOLATION s after the cut (and at least 1 s after the majority elected a new
        # leader of the CAS bucket, 4-9 s), before the old one steps down for want of a quorum
        # (about 20 s): two leaders at the heal.
        bucket = f"KV_{load.counters}"
        load.timeline.fault_at = load.timeline.mark(f"isolate {leader}")
        partition.isolate(leader)
        elected = None
        while time.monotonic() < load.timeline.fault_at + 14:
            views = partition.leader_views(bucket)
            if all(views[n] not in (None, "?", leader) for n in NODES if n != leader):
                elected = time.monotonic() - load.timeline.fault_at
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(max(1.0, load.timeline.fault_at + ISOLATION - time.monotonic()))
        views = {s: partition.leader_views(s) for s in load.streams}
        partition.rejoin(leader)
        load.timeline.heal_at = load.timeline.mark("rejoin")
        load.notes.append(
            f"isolated {leader} for {load.timeline.heal_at - load.timeline.fault_at:.1f}s; new "
            f"{bucket} leader after {elected and round(elected, 1)}s; views at heal {views}"
        )

    load, figures = await scenario(partition, "b:minority-leader", fault)
    verdict(partition, load, figures)


@rounds
async def test_gateway_cut_from_every_node(partition: Partition, round_: int) -> None:
    """(c) The gateway loses all three nodes for 10 s, then gets them back."""

    async def fault(load: Workload, leader: str) -> None:
        load.timeline.fault_at = load.timeline.mark("cut gw from all")
        for node in NODES:
            partition.cut("gw", node)
        await asyncio.sleep(10)
        for node in NODES:
            partition.heal("gw", node)
        load.timeline.heal_at = load.timeline.mark("heal")

    load, figures = await scenario(partition, "c:gw-cut-from-all", fault)
    verdict(partition, load, figures)


@rounds
async def test_leader_cluster_link_flapping(partition: Partition, round_: int) -> None:
    """(d) The leader's cluster link goes down for 1 s every 2 s, for 30 s."""

    async def fault(load: Workload, leader: str) -> None:
        load.timeline.fault_at = load.timeline.mark(f"flap {leader}-sw")
        cuts = await partition.flap((leader, "sw"), period=2.0, duration=30.0)
        load.timeline.heal_at = load.timeline.mark(f"flapping over ({cuts} cuts)")

    load, figures = await scenario(partition, "d:leader-link-flapping", fault)
    verdict(partition, load, figures)


@rounds
async def test_gateway_cut_from_two_nodes(partition: Partition, round_: int) -> None:
    """(e) The gateway loses two of three nodes (those it is connected to) for 20 s while the
    cluster stays whole: it must move its requests to the third within STEADY s, not leave
    them to time out on connections it does not know are dead."""

    async def fault(load: Workload, leader: str) -> None:
        conns = partition.gateway_connections()
        cut = sorted(NODES, key=lambda n: (-conns.get(n, 0), n != leader))[:2]
        load.notes.append(f"cut gw from {cut} (gateway connections {conns})")
        load.timeline.fault_at = load.timeline.mark(f"cut gw from {cut}")
        for node in cut:
            partition.cut("gw", node)
        await asyncio.sleep(20)
        for node in cut:
            partition.heal("gw", node)
        load.timeline.heal_at = load.timeline.mark("heal")

    load, figures = await scenario(partition, "e:gw-cut-from-two", fault)
    verdict(partition, load, figures, steady=True)


def test_harness_tears_down(tmp_path: Path) -> None:
    """The topology is gone after its context ends, processes and namespaces alike."""
    import subprocess

    from tests.faults.netns import HarnessUnavailable, check_available, partition

    try:
        check_available()
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))
    with partition(tmp_path) as harness:
        names = list(harness.ns.values())
        pids = [p.pid for p in harness._procs.values()]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in names if n in listed]
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
