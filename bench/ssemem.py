"""Memory per SSE watcher: a gateway's (and the raw broadcaster's) resident memory with N
watchers of one bucket open, read when they are all connected and idle; prints one table.

    python -m bench.ssemem [--watchers 1000,5000] [--targets gateway,raw] [--trace 25]

For each target it starts a fresh server (the gateway with its defaults, ``python -m app
serve``, but for the SSE caps every benchmark client needs on one address; the raw ASGI
broadcaster of bench/raw_asgi.py) on a nats-server of its own, with a bucket of 10 keys. It
opens and closes a few watchers first (what the first watch loads or starts is not per
watcher), reads the idle RSS, then adds watchers (bench/sseload.py, in processes of
``--per-process``) up to each count in ``--watchers`` and reads the RSS once every watcher
has its ``ready`` event and the server's RSS has stopped moving. RSS does not depend on how
busy the machine is the way latency does, so these figures hold on a loaded machine where
bench.run's p99 would not; KB/watcher is counted from the idle RSS, and between counts.

``--trace N`` runs the servers under tracemalloc and prints, per watcher, the N places
(``--trace-frames`` deep) whose allocations grew most from the idle state to the largest
count (tracemalloc slows a server and costs memory of its own: its RSS figures are not the
server's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.procs import (
    PYTHON,
    ROOT,
    Proc,
    Procs,
    die_with_parent,
    free_port,
    rss_mb,
    wait_http,
)

BUCKET = "watch"
KEYS = 10
SETTLE_STEP = 0.5
# Runs a module (``python -m``) with tracemalloc on and a snapshot written on SIGUSR1.
_TRACED = """
import os, runpy, signal, sys, tracemalloc
path = sys.argv[1]
def dump(*_):
    tracemalloc.take_snapshot().dump(path + ".tmp")
    os.replace(path + ".tmp", path)
signal.signal(signal.SIGUSR1, dump)
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def log(text: str) -> None:
    print(f"[ssemem] {text}", file=sys.stderr, flush=True)


async def _prepare(nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().create_key_value(bucket=BUCKET, history=1)
        for i in range(KEYS):
            await kv.put(f"u{i}", b"v" * 100)
    finally:
        await nc.close()


def _settled(pid: int, timeout: float = 20.0) -> float:
    """The RSS once two readings SETTLE_STEP apart agree within 0.1 MiB (or at the timeout)."""
    deadline = time.monotonic() + timeout
    last = rss_mb(pid)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_STEP)
        now = rss_mb(pid)
        if abs(now - last) < 0.1:
            return now
        last = now
    return last


class Load:
    """Watchers held open by bench.sseload processes until :meth:`close`."""

    def __init__(self, url: str, path: str, workdir: Path) -> None:
        self.url, self.path, self.workdir = url, path, workdir
        self.procs: list[subprocess.Popen[str]] = []
        self.open = 0

    def add(self, count: int, per_process: int) -> int:
        """``count`` more watchers; how many of them got their ``ready`` event."""
        started = []
        while count > 0:
            share = min(count, per_process)
            count -= share
            proc = subprocess.Popen(
                [
                    *(PYTHON, "-m", "bench.sseload", "--url", self.url, "--path", self.path),
                    *("--clients", str(share)),
                    *("--out", str(self.workdir / f"load-{len(self.procs)}.json")),
                ],
                cwd=str(ROOT),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent,  # prctl only
            )
            self.procs.append(proc)
            started.append(proc)
        ready = 0
        for proc in started:
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            if not line or line[0] != "READY":
                raise RuntimeError(f"SSE load did not start: {line}")
            ready += int(line[1])
        self.open += ready
        return ready

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write("STOP 0 0\n")
                proc.stdin.flush()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs, self.open = [], 0


def _snapshot(server: Proc, path: Path) -> tracemalloc.Snapshot:
    path.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the traced server wrote no snapshot")
        time.sleep(0.2)
    return tracemalloc.Snapshot.load(str(path))


def _start(
    target: str, args: argparse.Namespace, nats_url: str, workdir: Path, procs: Procs
) -> tuple[Proc, str, str]:
    """The server under test, ready: its process, base URL and watch path."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if target == "raw":
        module = [
            *("uvicorn", "bench.raw_asgi:app", "--host", "127.0.0.1", "--port", str(port)),
            *("--loop", "uvloop", "--http", "httptools", "--no-access-log"),
            *("--log-level", "warning"),
        ]
        env = {"BENCH_NATS_URL": nats_url, "BENCH_SSE_BUCKET": BUCKET}
        path, ready = "/sse", "/healthz"
    else:
        module = ["app", "serve"]
        caps = str(max(args.watchers) + 100)
        env = {
            "JSGW_NATS_URL": nats_url,
            "JSGW_HOST": "127.0.0.1",
            "JSGW_PORT": str(port),
            "JSGW_LOG_LEVEL": "warning",
            "JSGW_ACK_SECRET": secrets.token_hex(32),
            "JSGW_DATA_DIR": str(workdir / "gateway-data"),
            # Every load client is anonymous, on one address.
            "JSGW_SSE_MAX_PER_ADDRESS": caps,
            "JSGW_SSE_MAX_STREAMS": caps,
        }
        path, ready = f"/v1/kv/{BUCKET}/watch", "/readyz"
    if args.trace:
        command = [PYTHON, "-c", _TRACED, str(workdir / "snapshot"), *module]
        env["PYTHONTRACEMALLOC"] = str(args.trace_frames)
    else:
        command = [PYTHON, "-m", *module]
    proc = procs.start(target, command, env=env, log=workdir / f"{target}.log")
    wait_http(url + ready, proc, timeout=120)
    return proc, url, path


def measure(target: str, args: argparse.Namespace) -> dict[str, Any]:
    from app.nats.embedded import EmbeddedServer

    workdir = Path(tempfile.mkdtemp(prefix=f"ssemem-{target}-"))
    procs = Procs()
    nats = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        nats_url = nats.start()
        asyncio.run(_prepare(nats_url))
        server, url, path = _start(target, args, nats_url, workdir, procs)
        load = Load(url, path, workdir)
        load.add(args.warmup, args.per_process)  # the first watch's one-off costs
        load.close()
        idle = _settled(server.pid)
        first = _snapshot(server, workdir / "snapshot") if args.trace else None
        log(f"{target}: idle RSS {idle:.1f} MiB")
        rows = []
        for count in sorted(args.watchers):
            ready = load.add(count - load.open, args.per_process)
            rss = _settled(server.pid)
            rows.append({"watchers": count, "ready": load.open, "rss": rss})
            log(f"{target}: {load.open}/{count} ready (+{ready}), RSS {rss:.1f} MiB")
        last = _snapshot(server, workdir / "snapshot") if args.trace else None
        load.close()
        top = []
        if first is not None and last is not None:
            stats = last.compare_to(first, "traceback" if args.trace_frames > 1 else "lineno")
            top = [s for s in stats if s.size_diff > 0][: args.trace]
            traced = sum(s.size_diff for s in stats)
        return {
            "target": target,
            "idle": idle,
            "rows": rows,
            "top": top,
            "traced": traced if top else 0,
            "open": rows[-1],
        }
    finally:
        procs.stop_all()
        nats.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| server | watchers | ready | RSS MiB (idle → open) | KB/watcher from idle "
        "| KB/watcher from the previous count |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        idle, prev = result["idle"], None
        for row in result["rows"]:
            ready = row["ready"] or 1
            per = (row["rss"] - idle) * 1024 / ready
            step = ""
            if prev is not None and row["ready"] > prev["ready"]:
                step = f"{(row['rss'] - prev['rss']) * 1024 / (row['ready'] - prev['ready']):.1f}"
            lines.append(
                f"| {result['target']} | {row['watchers']:,} | {row['ready']:,} "
                f"| {idle:.1f} → {row['rss']:.1f} | {per:.1f} | {step} |"
            )
            prev = row
    for result in results:
        if not result["top"]:
            continue
        n = result["open"]["ready"] or 1
        lines += [
            "",
            f"tracemalloc, {result['target']}: growth from idle to {n:,} watchers, per watcher: "
            f"{result['traced'] / n:,.0f} bytes in all; the largest:",
            "",
            "| bytes | blocks | where |",
            "|---|---|---|",
        ]
        for stat in result["top"]:
            frames = " ← ".join(
                f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                for f in reversed(stat.traceback)
            )
            lines.append(f"| {stat.size_diff / n:.0f} | {stat.count_diff / n:.2f} | {frames} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--watchers", default="1000,5000", help="watcher counts, comma-separated")
    p.add_argument("--targets", default="gateway,raw", help="gateway, raw or both")
    p.add_argument("--per-process", type=int, default=2500, help="watchers per load process")
    p.add_argument("--warmup", type=int, default=20, help="watchers opened and closed first")
    p.add_argument("--trace", type=int, default=0, help="top N tracemalloc lines (gateway)")
    p.add_argument("--trace-frames", type=int, default=1, help="frames per tracemalloc entry")
    args = p.parse_args(argv)
    args.watchers = [int(x) for x in args.watchers.split(",") if x.strip()]
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = os.getloadavg()[0]
    results = [measure(target, args) for target in args.targets]
    print(f"Load average at the start: {load:.2f}; now {os.getloadavg()[0]:.2f}\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
