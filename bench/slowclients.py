"""Slow and idle clients against one gateway: silent sockets and request heads sent a byte at a
time, while a normal client keeps reading a key; prints one table.

    python -m bench.slowclients [--silent 600] [--slow 600] [--duration 40] [--nofile 1024]

It starts ``jsgw serve`` with its defaults (embedded nats-server, access log on) on a free
loopback port, under an open-file soft limit of ``--nofile`` (the default of many shells and
containers; ``jsgw serve`` raises it to the hard limit, and says so in its log). Then, for
``--duration`` seconds: ``--silent`` sockets that connect and send nothing and ``--slow``
sockets that send a request head one byte every ``--interval`` seconds, each reconnecting as
soon as the gateway closes it (as an attacker would); and one normal client reading a KV key
on a fresh connection every ``--every`` seconds. Reported: how long the gateway held each
hostile socket, the normal client's answers and latency, and the gateway's open descriptors.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.procs import PYTHON, Proc, free_port, wait_http
from bench.stats import percentile


@dataclass
class Figures:
    held: dict[str, list[float]] = field(default_factory=lambda: {"silent": [], "slow": []})
    normal_ok: int = 0
    normal_failed: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    descriptors: list[int] = field(default_factory=list)


async def _hold(kind: str, port: int, interval: float, until: float, figures: Figures) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: jsgw\r\nX-Slow: " + b"a" * 4096
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        closed = asyncio.ensure_future(reader.read(65536))
        try:
            for byte in head if kind == "slow" else b"":
                writer.write(bytes([byte]))
                done, _ = await asyncio.wait([closed], timeout=interval)
                if done or time.monotonic() >= until:
                    break
            remaining = until - time.monotonic()
            if not closed.done() and remaining > 0:
                await asyncio.wait([closed], timeout=remaining)
            if closed.done() and not closed.cancelled():
                figures.held[kind].append(time.monotonic() - started)
        except OSError:
            figures.held[kind].append(time.monotonic() - started)
        finally:
            closed.cancel()
            writer.close()


async def _normal(url: str, every: float, until: float, figures: Figures) -> None:
    # A fresh connection per request: what a client arriving during the attack needs.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=5, limits=limits) as client:
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                response = await client.get("/v1/kv/BENCH/keys/k")
                ok = response.status_code == 200
                if not ok:
                    figures.refusals[str(response.status_code)] += 1
            except httpx.HTTPError as exc:
                ok = False
                figures.refusals[type(exc).__name__] += 1
            if ok:
                figures.normal_ok += 1
                figures.latencies.append(time.monotonic() - started)
            else:
                figures.normal_failed += 1
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))  # a read of the kernel's table: instant


async def _count_descriptors(pid: int, until: float, figures: Figures) -> None:
    while time.monotonic() < until:
        figures.descriptors.append(_descriptors(pid))
        await asyncio.sleep(1)


async def run(args: argparse.Namespace, url: str, pid: int) -> Figures:
    figures = Figures()
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        await client.put("/v1/kv/BENCH", json={})
        await client.put("/v1/kv/BENCH/keys/k", content=b"v")
    before = _descriptors(pid)
    until = time.monotonic() + args.duration
    port = int(url.rsplit(":", 1)[1])
    tasks = [_hold("silent", port, args.interval, until, figures) for _ in range(args.silent)]
    tasks += [_hold("slow", port, args.interval, until, figures) for _ in range(args.slow)]
    tasks += [_normal(url, args.every, until, figures), _count_descriptors(pid, until, figures)]
    await asyncio.gather(*tasks)
    await asyncio.sleep(1)
    figures.descriptors = [
        before,
        *figures.descriptors,
        _descriptors(pid),
    ]
    return figures


def _limit_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line.split()[3]
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silent", type=int, default=600)
    parser.add_argument("--slow", type=int, default=600)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between bytes")
    parser.add_argument("--every", type=float, default=0.05, help="normal client's period")
    parser.add_argument("--nofile", type=int, default=1024, help="the gateway's soft limit")
    parser.add_argument(
        "--max-connections", type=int, default=None, help="JSGW_MAX_CONNECTIONS (default: its)"
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # this process holds every hostile socket
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-slowclients-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"JSGW_PORT": str(port), "JSGW_DATA_DIR": str(workdir / "data")}
    if args.max_connections is not None:
        env["JSGW_MAX_CONNECTIONS"] = str(args.max_connections)
    command = f"ulimit -Sn {args.nofile} && exec {PYTHON} -m app serve"
    gateway = Proc("gateway", ["sh", "-c", command], env=env, log=workdir / "gateway.log")
    try:
        wait_http(f"{url}/readyz", gateway)
        figures = asyncio.run(run(args, url, gateway.pid))
        limit = _limit_of(gateway.pid)
    finally:
        gateway.stop()
    held = {kind: sorted(times) for kind, times in figures.held.items()}
    latencies = sorted(figures.latencies)
    total = figures.normal_ok + figures.normal_failed
    settings = (
        "defaults"
        if args.max_connections is None
        else f"JSGW_MAX_CONNECTIONS={args.max_connections}"
    )
    title = f"{args.duration:.0f} s, {settings}, soft limit {args.nofile}"
    print(f"### Slow and idle clients ({title})")
    print()
    print("| measure | figure |")
    print("|---|---|")
    print(f"| gateway open-file limit after start | {limit} (started at {args.nofile}) |")
    for kind, count in (("silent", args.silent), ("slow", args.slow)):
        times = held[kind]
        if times:
            print(
                f"| {count} {kind} sockets: closed by the gateway | {len(times):,} times; "
                f"held median {percentile(times, 50):.1f} s, max {times[-1]:.1f} s |"
            )
        else:
            print(f"| {count} {kind} sockets: closed by the gateway | never |")
    p50 = percentile(latencies, 50) * 1000 if latencies else float("nan")
    p99 = percentile(latencies, 99) * 1000 if latencies else float("nan")
    print(
        f"| normal client (fresh connection per KV GET) | {figures.normal_ok:,} of {total:,} "
        f"answered 200 (others: {dict(figures.refusals) or 'none'}); "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms |"
    )
    d = figures.descriptors
    print(f"| gateway descriptors: before / peak / after | {d[0]:,} / {max(d):,} / {d[-1]:,} |")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
