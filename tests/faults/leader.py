"""Find a stream's leader through the gateway, kill it, and bring it back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from tests.cluster import Cluster


@dataclass
class Fault:
    old_leader: str
    new_leader: str
    paused: float
    killed_at: float
    new_leader_at: float
    restarted_at: float
    current_at: float

    def __str__(self) -> str:
        return (
            f"leader {self.old_leader} paused {self.paused:.1f}s then killed; "
            f"{self.new_leader} leader after "
            f"{self.new_leader_at - self.killed_at:.2f}s; {self.old_leader} restarted after "
            f"{self.restarted_at - self.killed_at:.2f}s, all replicas current after "
            f"{self.current_at - self.killed_at:.2f}s"
        )


async def stream_leader(
    http: httpx.AsyncClient, stream: str, *, other_than: str | None = None, timeout: float = 15.0
) -> str:
    """The stream's leader as ``GET /v1/streams/{stream}`` reports it (``cluster.leader``)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        response = await http.get(f"/v1/streams/{stream}")
        if response.status_code == 200:
            leader = (response.json().get("cluster") or {}).get("leader")
            if leader and leader != other_than:
                return leader
        last = f"{response.status_code} {response.text[:300]}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"no leader for {stream} (other than {other_than}) in {timeout}s: {last}")


async def kill_and_restart_leader(
    cluster: Cluster,
    http: httpx.AsyncClient,
    stream: str,
    *,
    down: float,
    pause: float = 0.0,
    just_before: Callable[[], Awaitable[None]] | None = None,
) -> Fault:
    """SIGKILL the stream leader, wait for a new one, restart the old node after ``down`` s.

    With ``pause``, the leader is first stopped (SIGSTOP) for that long, so that the writes
    it holds when it dies were sent and never answered: their outcome is unknown.
    ``just_before`` runs once the leader is known, right before the pause or kill.
    """
    old = await stream_leader(http, stream)
    if just_before is not None:
        await just_before()
    if pause:
        cluster.pause(old)
        await asyncio.sleep(pause)
    killed_at = time.monotonic()
    await cluster.kill(old)
    new = await stream_leader(http, stream, other_than=old)
    new_leader_at = time.monotonic()
    await asyncio.sleep(max(0.0, killed_at + down - time.monotonic()))
    await cluster.start_node(old)
    restarted_at = time.monotonic()
    await cluster.wait_stream_current(stream)
    return Fault(old, new, pause, killed_at, new_leader_at, restarted_at, time.monotonic())
