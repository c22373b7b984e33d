"""Soak: a fixed request mix against one gateway for a while; errors, latency and memory.

    python -m bench.soak --duration 300 --clients 16
    python -m bench.soak --url http://127.0.0.1:8080 --pid <gateway pid> --duration 3600

Without ``--url`` the script starts the gateway itself (``python -m app`` on a free loopback
port, an embedded nats-server storing in a temporary directory) and stops it at the end.
The clients are ``--clients`` httpx.AsyncClient loops in this one asyncio process, each
with its own keep-alive connection, back to back: for a soak that is enough (the point is a
steady mix for a long time, not the highest rate), but the client shares the machine's CPUs
with the gateway. Every client runs the same fixed cycle of operations (``MIX``).

It prints, per operation, the count of each status and error code, p50/p99 latency, and the
gateway's resident memory (VmRSS of the gateway process alone, and of its embedded
nats-server) before the load, at its peak, and at the end. It exits 1 when a request failed
with a 5xx or a transport error, 0 otherwise. Not a test: nothing is asserted about rates.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.procs import PYTHON, Proc, free_port, tree_pids, wait_http
from bench.stats import percentile

# One client's cycle: each operation as often as it appears here.
MIX = (
    "publish",
    "kv.put",
    "direct.seq",
    "publish",
    "kv.get",
    "stream.info",
    "publish",
    "direct.last",
    "kv.put",
    "publish",
    "direct.seq",
    "kv.get",
    "publish.batch",
    "publish",
    "kv.get",
    "direct.seq",
    "stream.info",
    "kv.put",
    "publish",
    "direct.last",
)
PAYLOAD = os.urandom(192)
KEYS = 256
SUBJECTS = 16
BATCH = 10


@dataclass
class Stats:
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, op: str, outcome: str, seconds: float) -> None:
        self.outcomes[op][outcome] += 1
        self.latencies[op].append(seconds * 1000)

    @property
    def failures(self) -> int:
        return sum(
            n
            for counts in self.outcomes.values()
            for outcome, n in counts.items()
            if outcome.startswith(("5", "ERR"))
        )


@dataclass
class Target:
    stream: str
    bucket: str | None
    last_seq: int = 1


def rss_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


class Memory:
    """VmRSS of the gateway process and, separately, of its child processes (nats-server)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.samples: list[tuple[int, int]] = []

    def sample(self) -> tuple[int, int] | None:
        if self.pid is None:
            return None
        own = rss_kib(self.pid) or 0
        children = sum(rss_kib(p) or 0 for p in tree_pids(self.pid) if p != self.pid)
        self.samples.append((own, children))
        return own, children

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def _outcome(response: httpx.Response) -> str:
    code = ""
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        with contextlib.suppress(ValueError):
            code = " " + str(response.json().get("code", ""))
    return f"{response.status_code}{code}"


def operations(
    http: httpx.AsyncClient, target: Target, client: int, rng: random.Random
) -> dict[str, Callable[[], Awaitable[httpx.Response]]]:
    stream, bucket = target.stream, target.bucket
    counter = iter(range(1 << 62))

    async def publish() -> httpx.Response:
        subject = f"{stream.lower()}.c{client}.s{rng.randrange(SUBJECTS)}"
        response = await http.post(
            f"/v1/publish/{subject}",
            content=PAYLOAD,
            headers={"Nats-Msg-Id": f"{client}-{next(counter)}-{uuid.uuid4().hex[:8]}"},
        )
        if response.status_code == 200:
            target.last_seq = max(target.last_seq, response.json()["seq"])
        return response

    async def publish_batch() -> httpx.Response:
        data = base64.b64encode(PAYLOAD).decode()
        messages = [
            {"subject": f"{stream.lower()}.c{client}.batch", "data": data} for _ in range(BATCH)
        ]
        return await http.post("/v1/publish", json={"messages": messages})

    async def stream_info() -> httpx.Response:
        return await http.get(f"/v1/streams/{stream}")

    async def direct_seq() -> httpx.Response:
        seq = rng.randint(1, target.last_seq)
        return await http.get(f"/v1/streams/{stream}/direct", params={"seq": seq})

    async def direct_last() -> httpx.Response:
        subject = f"{stream.lower()}.c{client}.s{rng.randrange(SUBJECTS)}"
        return await http.get(f"/v1/streams/{stream}/last/{subject}")

    async def kv_put() -> httpx.Response:
        return await http.put(f"/v1/kv/{bucket}/keys/k{rng.randrange(KEYS)}", content=PAYLOAD)

    async def kv_get() -> httpx.Response:
        return await http.get(f"/v1/kv/{bucket}/keys/k{rng.randrange(KEYS)}")

    ops = {
        "publish": publish,
        "publish.batch": publish_batch,
        "stream.info": stream_info,
        "direct.seq": direct_seq,
        "direct.last": direct_last,
    }
    if bucket is not None:
        ops.update({"kv.put": kv_put, "kv.get": kv_get})
    return ops


async def client_loop(
    base_url: str, target: Target, client: int, deadline: float, stats: Stats, seed: int
) -> None:
    rng = random.Random(seed * 1000 + client)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as http:
        ops = operations(http, target, client, rng)
        cycle = [op for op in MIX if op in ops]
        step = client  # clients start at different places of the cycle
        while time.monotonic() < deadline:
            op = cycle[step % len(cycle)]
            step += 1
            started = time.perf_counter()
            try:
                outcome = _outcome(await ops[op]())
            except httpx.HTTPError as exc:
                outcome = f"ERR {type(exc).__name__}"
            stats.add(op, outcome, time.perf_counter() - started)


async def prepare(base_url: str, clients: int) -> Target:
    """A stream (file storage, direct get) and a KV bucket of this run's own, with a value on
    every subject and key that the mix reads, so that reads find something."""
    suffix = uuid.uuid4().hex[:8]
    stream, bucket = f"SOAK_{suffix}", f"soak_{suffix}"
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        created = await http.put(
            f"/v1/streams/{stream}",
            json={
                "subjects": [f"{stream.lower()}.>"],
                "allow_direct": True,
                "max_msgs": 500_000,
                "duplicate_window": "2m",
            },
        )
        created.raise_for_status()
        for client in range(clients):
            for n in range(SUBJECTS):
                subject = f"{stream.lower()}.c{client}.s{n}"
                (await http.post(f"/v1/publish/{subject}", content=PAYLOAD)).raise_for_status()
        kv = await http.put(f"/v1/kv/{bucket}", json={"history": 1})
        if kv.status_code not in (200, 201):
            print(f"KV not available ({kv.status_code}): the mix runs without kv.put/kv.get")
            return Target(stream, None)
        for key in range(KEYS):  # every kv.get finds a value
            (await http.put(f"/v1/kv/{bucket}/keys/k{key}", content=PAYLOAD)).raise_for_status()
    return Target(stream, bucket)


async def cleanup(base_url: str, target: Target) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        await http.delete(f"/v1/streams/{target.stream}")
        if target.bucket:
            await http.delete(f"/v1/kv/{target.bucket}")


def report(stats: Stats, elapsed: float, memory: Memory) -> None:
    total = sum(len(v) for v in stats.latencies.values())
    print(f"\n{total} requests in {elapsed:.1f} s ({total / elapsed:.0f}/s)\n")
    heads = ("requests", "req/s", "p50 ms", "p99 ms", "max ms")
    print(f"{'operation':<14} {heads[0]:>9} " + " ".join(f"{h:>8}" for h in heads[1:]))
    for op in sorted(stats.latencies):
        values = sorted(stats.latencies[op])
        print(
            f"{op:<14} {len(values):>9} {len(values) / elapsed:>8.0f} "
            f"{percentile(values, 50):>8.1f} {percentile(values, 99):>8.1f} {values[-1]:>8.1f}"
        )
    print(f"\n{'operation':<14} {'status / error code':<36} {'count':>9}")
    for op in sorted(stats.outcomes):
        for outcome, count in sorted(stats.outcomes[op].items()):
            print(f"{op:<14} {outcome:<36} {count:>9}")
    print(f"\nfailures (5xx or transport errors): {stats.failures}")
    if not memory.samples:
        print("memory: no gateway pid (pass --pid with --url)")
        return
    (start_own, start_child), (end_own, end_child) = memory.samples[0], memory.samples[-1]
    peak_own = max(own for own, _ in memory.samples)
    peak_child = max(child for _, child in memory.samples)
    mib = 1024
    print(f"\n{'VmRSS MiB':<14} {'start':>8} {'peak':>8} {'end':>8}")
    print(f"{'gateway':<14} {start_own / mib:>8.1f} {peak_own / mib:>8.1f} {end_own / mib:>8.1f}")
    if peak_child:
        print(
            f"{'nats-server':<14} {start_child / mib:>8.1f} {peak_child / mib:>8.1f} "
            f"{end_child / mib:>8.1f}"
        )


async def soak(base_url: str, pid: int | None, args: argparse.Namespace) -> int:
    target = await prepare(base_url, args.clients)
    memory = Memory(pid)
    memory.sample()
    stats = Stats()
    stop = asyncio.Event()
    watcher = asyncio.create_task(memory.watch(stop))
    print(
        f"soak: {args.duration:.0f} s, {args.clients} clients in this process, gateway "
        f"{base_url} (pid {pid or '?'}), stream {target.stream}, bucket {target.bucket}",
        flush=True,
    )
    started = time.monotonic()
    deadline = started + args.duration
    await asyncio.gather(
        *(client_loop(base_url, target, c, deadline, stats, args.seed) for c in range(args.clients))
    )
    elapsed = time.monotonic() - started
    stop.set()
    await watcher
    memory.sample()
    await cleanup(base_url, target)
    report(stats, elapsed, memory)
    return 1 if stats.failures else 0


def start_gateway(workdir: Path) -> tuple[Proc, str]:
    port = free_port()
    env = {
        "JSGW_HOST": "127.0.0.1",
        "JSGW_PORT": str(port),
        "JSGW_DATA_DIR": str(workdir / "data"),
        "JSGW_LOG_LEVEL": "warning",
    }
    os.environ.pop("JSGW_NATS_URL", None)  # the embedded nats-server
    proc = Proc("gateway", [PYTHON, "-m", "app"], env=env, log=workdir / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/readyz", proc, timeout=60)
    return proc, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway (default: start one here)")
    parser.add_argument("--pid", type=int, help="its process id, to report its memory")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.url:
        return asyncio.run(soak(args.url.rstrip("/"), args.pid, args))
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-soak-"))
    proc: Proc | None = None
    try:
        proc, url = start_gateway(workdir)
        code = asyncio.run(soak(url, proc.pid, args))
        if not proc.alive():
            print(f"the gateway exited during the soak:\n{proc.tail()}")
            return 1
        return code
    finally:
        if proc is not None:
            proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
