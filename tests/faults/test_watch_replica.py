"""A KV watch resumed again and again while one replica of its bucket lags behind the others.

A watch's consumers are R1, and nats-server places each on any replica of the bucket's stream
(tests/faults/netns.py's topology, three nodes). Here what the cluster sends one follower is
held in a queue of up to ``LAG`` s (``Partition.lag``; the writes are more than its rate): it
applies each revision about that much after the others, and it still answers. A client writes
a key per revision (1 KiB values) through the gateway while a
watcher drops its connection every ``HOLD`` s and resumes with ``Last-Event-ID``, as an
``EventSource`` does; each resume is a new catch-up consumer and a new shared feed, each placed
anew. When the catch-up lands on the lagging replica and the feed does not, the catch-up ends
short of the feed (app.kv.watch): the test fails if any revision is missed or repeated, and
checks that such a catch-up happened (the gateway logs each one it completes from the leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import httpx
import pytest

from tests.faults.netns import NODES, Partition

pytestmark = pytest.mark.slow

# A resume lands its catch-up, not its feed, on the lagging replica about 2 times in 9: the
# watcher resumes until two did (at least 10 times, at most RESUMES).
RESUMES = 60
HOLD = 1.5  # s a watch connection is kept before it is dropped
LAG = 0.3  # s: the lagging node's queue (its rate, 256 kbit/s, is below the writes' load)
VALUE = b"v" * 1024  # a put a revision, about 100 a second: 800 kbit/s into each replica
COMPLETED = "read from the stream leader"  # app.kv.watch's log line


class Watcher:
    """An EventSource's view of one watch: every put it got, and its Last-Event-ID."""

    def __init__(self, http: httpx.AsyncClient, bucket: str) -> None:
        self.http = http
        self.bucket = bucket
        self.seen: list[int] = []
        self.last_id: str | None = None
        self.errors: list[str] = []

    async def resume(self, *, hold: float | None = None, until: int | None = None) -> None:
        """One connection: read for ``hold`` s, or until revision ``until`` has come."""
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        url = f"/v1/kv/{self.bucket}/watch"
        async with asyncio.timeout(hold), self.http.stream("GET", url, headers=headers) as resp:
            if resp.status_code in (503, 504):  # a consumer made too slowly: tried again
                self.errors.append((await resp.aread()).decode())
                return
            assert resp.status_code == 200, await resp.aread()
            event = ""
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:") and event == "error":
                    self.errors.append(line)  # the watch ends; the client resumes
                elif line.startswith("id:"):
                    self.last_id = line.partition(":")[2].strip()
                    if event == "put":
                        self.seen.append(int(self.last_id))
                    if until is not None and int(self.last_id) >= until:
                        return

    async def hold(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await self.resume(hold=seconds)


def completed(partition: Partition) -> int:
    """The catch-ups the gateway has completed from the stream leader (its log lines)."""
    return partition.gateway_log.read_text().count(COMPLETED)


async def lagging_follower(partition: Partition) -> str:
    """A node the gateway holds no connection to (so that its answers do not queue behind
    the lag) and that does not lead JetStream's meta group (which every consumer's creation
    goes through): restarted while it does."""
    conns = partition.gateway_connections()
    node = next(n for n in NODES if conns.get(n, 0) == 0)
    for _ in range(5):
        if partition.meta_leader() not in (node, None):
            return node
        await asyncio.to_thread(partition.restart_node, node)
        await partition.wait_for_jetstream()
    raise AssertionError(f"{node} stays the meta leader")


async def test_a_watch_resumed_while_a_replica_lags_misses_nothing(partition: Partition) -> None:
    behind = await lagging_follower(partition)
    bucket = f"L{uuid.uuid4().hex[:10]}"
    async with httpx.AsyncClient(base_url=partition.gateway_url, timeout=10) as http:
        made = await http.put(f"/v1/kv/{bucket}", json={"replicas": 3})
        assert made.status_code == 201, made.text
        stream = f"KV_{bucket}"
        await partition.wait_stream_current(stream)
        if await partition.stream_leader(stream) == behind:
            await partition.move_leader(stream, next(n for n in NODES if n != behind))
        partition.lag(behind, LAG)
        acked: list[int] = []
        stop = asyncio.Event()

        async def writer() -> None:
            n = 0
            while not stop.is_set():
                # a key per revision: nothing is superseded, every revision must be watched
                put = await http.put(f"/v1/kv/{bucket}/keys/k{n}", content=VALUE)
                assert put.status_code == 200, put.text
                acked.append(put.json()["revision"])
                n += 1
                await asyncio.sleep(0.01)

        watcher = Watcher(http, bucket)
        writing = asyncio.create_task(writer())
        try:
            for resumes in range(1, RESUMES + 1):
                await watcher.hold(HOLD)
                if resumes >= 10 and completed(partition) >= 2:
                    break
        finally:
            stop.set()
            await writing
        partition.lag(behind, 0)
        async with asyncio.timeout(30):
            while not watcher.seen or watcher.seen[-1] < max(acked):
                await watcher.resume(until=max(acked))

    missed = sorted(set(range(1, max(acked) + 1)) - set(watcher.seen))
    repeated = len(watcher.seen) - len(set(watcher.seen))
    done = completed(partition)
    assert not missed and not repeated, (
        f"{len(missed)} revisions missed (first {missed[:10]}), {repeated} repeated, of "
        f"{max(acked)}; {done} catch-ups completed from the leader; "
        f"errors {watcher.errors[:3]}"
    )
    # The case this test is for happened (a catch-up on the lagging replica, behind its feed):
    # otherwise it proved nothing.
    assert done > 0, (
        f"no catch-up landed on {behind} behind its feed in {resumes} resumes ({max(acked)} "
        f"writes; {partition.gateway_connections()} gateway connections)"
    )
