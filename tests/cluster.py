"""A 3-node nats-server cluster on loopback ports, for the fault tests.

Each node is an :class:`EmbeddedServer` with its own store directory, a distinct server name
and a cluster listener on a port picked here (routes must be known before any node starts,
so these ports cannot be left to the servers). Client ports are picked by the servers
themselves and kept across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors

from app.nats.embedded import EmbeddedServer

T = TypeVar("T")

# A nats-server child gets SIGTERM when the *thread* that started it ends (PR_SET_PDEATHSIG
# follows the parent thread, not the process). asyncio.to_thread's workers end with the
# test's event loop, which would take a restarted node down with them: servers are started
# and stopped from this one thread, which lives as long as the test session.
_SERVER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-servers")


async def off_loop(call: Callable[[], T]) -> T:
    """Run a blocking server start/stop/kill without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_SERVER_THREAD, call)


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


async def wait_for_meta_leader(nc: nats.NATS, replicas: int, timeout: float) -> None:
    """Until the cluster ``nc`` is connected to can place a stream of ``replicas`` replicas
    (a meta leader is elected and enough nodes are up)."""
    probe = f"PROBE_{int(time.monotonic() * 1000)}"
    config = json.dumps(
        {
            "name": probe,
            "subjects": [f"probe.{probe}"],
            "num_replicas": replicas,
            "storage": "memory",
        }
    ).encode()
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            reply = await nc.request(f"$JS.API.STREAM.CREATE.{probe}", config, timeout=2)
            body = json.loads(reply.data)
            if "error" not in body or body["error"].get("err_code") == 10058:
                await nc.request(f"$JS.API.STREAM.DELETE.{probe}", timeout=2)
                return
            last = body["error"].get("description", str(body["error"]))
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.2)
    raise AssertionError(f"the cluster had no JetStream meta leader after {timeout}s: {last}")


async def wait_for_stream_current(
    nc: nats.NATS, stream: str, replicas: int, timeout: float
) -> dict:
    """Until ``stream`` has a leader and its other ``replicas - 1`` replicas are current and
    online; returns its info."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", timeout=2)).data)
            cluster = info.get("cluster") or {}
            followers = cluster.get("replicas") or []
            if (
                "error" not in info
                and cluster.get("leader")
                and len(followers) == replicas - 1
                and all(r.get("current") and not r.get("offline") for r in followers)
            ):
                return info
            last = info.get("error") or cluster
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.2)
    raise AssertionError(f"stream {stream} did not get all replicas current: {last}")


class Cluster:
    """Three (or ``size``) JetStream nodes routed to each other; node names ``n1``, ``n2``, ..."""

    def __init__(
        self,
        base_dir: Path,
        size: int = 3,
        name: str = "jsgw-faults",
        binary: str | None = None,  # another release's nats-server (tests/releases.py)
    ) -> None:
        self.base_dir = base_dir
        cluster_ports = free_ports(size)
        routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in cluster_ports)
        self.nodes: dict[str, EmbeddedServer] = {}
        for index, port in enumerate(cluster_ports, start=1):
            node = f"n{index}"
            self.nodes[node] = EmbeddedServer(
                base_dir / node / "store",
                log_file=base_dir / node / "server.log",
                extra_args=[
                    "-n",
                    node,
                    "--cluster_name",
                    name,
                    "--cluster",
                    f"nats://127.0.0.1:{port}",
                    "--routes",
                    routes,
                ],
                binary=binary,
            )

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.pid is not None:  # a paused node would not see its SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
            node.stop()

    async def kill(self, name: str) -> None:
        """SIGKILL one node, as a crash would; its store and ports are kept for a restart."""
        node = self.nodes[name]
        await off_loop(node.kill)
        await off_loop(node.stop)  # nothing left to stop: only tidies its ports-file directory

    def pause(self, name: str) -> None:
        """SIGSTOP one node: it holds its connections but answers nothing (a stalled leader)."""
        pid = self.nodes[name].pid
        assert pid is not None, f"{name} is not running"
        os.kill(pid, signal.SIGSTOP)

    async def start_node(self, name: str) -> None:
        await off_loop(self.nodes[name].start)

    async def wait_for_jetstream(self, timeout: float = 30.0) -> None:
        """Wait until the cluster has a meta leader and can place an R3 stream on all nodes."""
        nc = await nats.connect(self.urls, connect_timeout=2, max_reconnect_attempts=-1)
        try:
            await wait_for_meta_leader(nc, len(self.nodes), timeout)
        finally:
            await nc.close()

    def meta_leader(self) -> str:
        """The name of the node that leads the JetStream meta group (as a running node's
        monitoring endpoint reports it)."""
        import urllib.request

        for node in self.nodes.values():
            if node.running and node.monitor_url:
                with urllib.request.urlopen(f"{node.monitor_url}/jsz", timeout=5) as answer:
                    leader = (json.loads(answer.read()).get("meta_cluster") or {}).get("leader")
                if leader:
                    return str(leader)
        raise AssertionError("no running node reports a meta leader")

    async def wait_stream_current(self, stream: str, timeout: float = 20.0) -> dict:
        """Wait until the stream has a leader and every replica is current; return its info."""
        nc = await nats.connect(self.urls, connect_timeout=2, max_reconnect_attempts=-1)
        try:
            return await wait_for_stream_current(nc, stream, len(self.nodes), timeout)
        finally:
            await nc.close()
