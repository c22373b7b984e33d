"""Publish with PubAck and fetch + confirmed acks: a gateway with its defaults (access log on)
against nats-py, in interleaved rounds, with the gateway's CPU µs per operation.

* ``publish``: wrk (``-t1 -c64``) ``POST /v1/publish/pub.gw.<i>`` with a 100-byte body, against
  ``bench.natsload publish`` (``js.publish``, 64 in flight on one connection);
* ``batch``: ``POST /v1/publish`` with ``--batch`` messages per request (non-atomic, one
  PubAck each) from ``--connections`` asyncio clients, against nats-py publishing the same
  messages (``bench.natsload publish``, ``--batch`` in flight per client), messages/s;
* ``fetch``: ``bench.httpload fetchack`` (fetch 256, then ack them all in one request that
  answers after the server confirmed each) against ``bench.natsload fetchack``.

Run: ``python -m bench.pubfetch [--duration 4] [--rounds 2] [--workers 1]
[--profile DIR]`` (``--profile``: the gateway's py-spy stacks (collapsed) per row, first round,
with ``--py-spy`` naming the binary). The CPU of a gateway is that of its process tree
(bench.procs.cpu_seconds); the machine's load average is printed before each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench import wrk
from bench.natsload import fetch_consumer
from bench.procs import (
    PYTHON,
    ROOT,
    Proc,
    Procs,
    cpu_seconds,
    free_port,
    start_gateway,
    wait_http,
)

FETCH_MESSAGES = 400_000


async def prepare(nats_url: str, fetch_messages: int, gateways: int) -> None:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(nats_url)
    js = nc.jetstream(timeout=30)
    await js.add_stream(StreamConfig(name="PUB", subjects=["pub.>"], max_msgs=2_000_000))
    await js.add_stream(StreamConfig(name="FETCH", subjects=["fetch.>"]))
    payload = b"m" * 100
    stored = 0
    while stored < fetch_messages:
        for i in range(stored, fetch_messages):
            await nc.publish(f"fetch.{i % 100}", payload)
            if i % 5_000 == 4_999:
                await nc.flush()
        await nc.flush()
        await asyncio.sleep(0.5)
        stored = (await js.stream_info("FETCH")).state.messages
    for name in ("http", "direct", "before")[: gateways + 1]:
        await js.add_consumer("FETCH", fetch_consumer(name))
    await nc.close()


def load(module: str, mode: str, *args: str, timeout: float = 180) -> dict[str, Any]:
    out = subprocess.run(
        [PYTHON, "-m", module, mode, *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        timeout=timeout,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"{module} {mode} failed: {out.stderr[-600:]}")
    result: dict[str, Any] = orjson.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=4)
    parser.add_argument("--warmup", type=float, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100, help="messages per batch publish")
    parser.add_argument("--connections", type=int, default=4, help="batch publish clients")
    parser.add_argument("--only", default="publish,batch,fetch")
    parser.add_argument("--profile", type=Path, help="write py-spy stacks (collapsed) here")
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the gateway")
    parser.add_argument(
        "--before", type=Path, help="also a gateway run from this checkout (the code before)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    binary = wrk.find()
    if binary is None:
        raise SystemExit(f"wrk is not installed ({wrk.INSTALL_HINT})")
    from app.nats.embedded import EmbeddedServer

    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-pubfetch-"))
    procs = Procs()
    nats = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        nats_url = nats.start()
        env = dict(item.split("=", 1) for item in args.env)
        gateway, base = start_gateway(procs, nats_url, workdir, workers=args.workers, env=env)
        gateways = [("jsgw", gateway, base)]
        if args.before is not None:
            port = free_port()
            earlier = procs.start(
                "before",
                [PYTHON, "-m", "app", "serve"],
                env={
                    **env,
                    "PYTHONPATH": str(args.before),
                    "JSGW_NATS_URL": nats_url,
                    "JSGW_PORT": str(port),
                    "JSGW_ACK_SECRET": "b" * 64,
                    "JSGW_DATA_DIR": str(workdir / "before-data"),
                },
                log=workdir / "before.log",
                cwd=args.before,
            )
            wait_http(f"http://127.0.0.1:{port}/readyz", earlier, timeout=60)
            gateways.append(("before", earlier, f"http://127.0.0.1:{port}"))
        messages = FETCH_MESSAGES if "fetch" in only else 0
        asyncio.run(prepare(nats_url, messages, len(gateways)))
        lua = wrk.script(
            [("POST", f"/v1/publish/pub.gw.{i}", {}, "v" * 100) for i in range(1000)],
            workdir / "publish.lua",
        )

        # Every run is warmed up by a run of its own (args.warmup seconds, not counted), so
        # the gateway's CPU is measured over the counted run alone.
        def load_of(module: str, mode: str, *extra: str) -> Callable[[float], dict[str, Any]]:
            def run(seconds: float) -> dict[str, Any]:
                return load(module, mode, *extra, "--duration", str(seconds), "--warmup", "0")

            return run

        def gw_publish(url: str) -> Callable[[float], dict[str, Any]]:
            return lambda seconds: wrk.run(
                binary, url, lua, threads=1, connections=64, duration=seconds
            )

        # (kind, label, run, gateway process or None for nats-py)
        rows: list[tuple[str, str, Callable[[float], dict[str, Any]], Proc | None]] = []
        for name, server, url in gateways:
            if "publish" in only:
                rows.append(
                    (
                        "publish",
                        f"{name} POST /v1/publish/{{subject}}",
                        gw_publish(url),
                        server,
                    )
                )
            if "batch" in only:
                rows.append(
                    (
                        "batch",
                        f"{name} POST /v1/publish, {args.batch} msgs x {args.connections} clients",
                        load_of(
                            "bench.httpload",
                            "pubbatch",
                            *("--url", url, "--batch", str(args.batch)),
                            *("--concurrency", str(args.connections)),
                        ),
                        server,
                    )
                )
            if "fetch" in only:
                consumer = "http" if name == "jsgw" else "before"
                rows.append(
                    (
                        "fetch",
                        f"{name} fetch 256 + ack",
                        load_of(
                            "bench.httpload",
                            "fetchack",
                            *("--url", url, "--stream", "FETCH", "--consumer", consumer),
                            *("--batch", "256"),
                        ),
                        server,
                    )
                )
        if "publish" in only:
            n = ["--subject", "pub.nats", "--concurrency", "64"]
            rows.append(
                (
                    "publish",
                    "nats-py js.publish, 64 in flight",
                    load_of("bench.natsload", "publish", "--nats", nats_url, *n),
                    None,
                )
            )
        if "batch" in only:
            n = ["--subject", "pub.nb", "--concurrency", str(args.batch * args.connections)]
            rows.append(
                (
                    "batch",
                    f"nats-py js.publish, {args.batch * args.connections} in flight",
                    load_of("bench.natsload", "publish", "--nats", nats_url, *n),
                    None,
                )
            )
        if "fetch" in only:
            n = ["--stream", "FETCH", "--consumer", "direct", "--batch", "256"]
            rows.append(
                (
                    "fetch",
                    "nats-py fetch(256) + ack_sync",
                    load_of("bench.natsload", "fetchack", "--nats", nats_url, *n),
                    None,
                )
            )
        got: dict[str, list[tuple[float, float | None]]] = {label: [] for _, label, _, _ in rows}
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
            for kind, label, run, proc in rows if round_ % 2 == 0 else rows[::-1]:
                spy = None
                if args.profile and proc is gateway and round_ == 0:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = subprocess.Popen(
                        [
                            args.py_spy,
                            "record",
                            "--subprocesses",
                            "--nonblocking",
                            "--format",
                            "raw",
                            "-d",
                            str(int(args.duration + args.warmup + 1)),
                            "-o",
                            str(args.profile / f"{kind}.txt"),
                            "--pid",
                            str(gateway.pid),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                run(args.warmup)
                cpu = cpu_seconds(proc.pid) if proc else 0.0
                result = run(args.duration)
                spent = cpu_seconds(proc.pid) - cpu if proc else 0.0
                if spy is not None:
                    spy.wait()
                ops = result.get("ops") or result.get("messages") or 0
                if result.get("errors") or result.get("non_2xx"):
                    print(f"  {label}: errors {result}")
                us = spent / ops * 1e6 if proc and ops else None
                got[label].append((result["rate"], us))
                cell = f", gateway {us:.1f} µs CPU/op" if us else ""
                print(f"  {label}: {result['rate']:,.0f}/s{cell}", flush=True)
        print(
            f"\nmedians of {args.rounds} round(s) of {args.duration:g} s, {args.workers} worker(s)"
        )
        for kind in ("publish", "batch", "fetch"):
            labels = [label for k, label, _, _ in rows if k == kind]
            if not labels:
                continue
            native = statistics.median(rate for rate, _ in got[labels[-1]])
            for label in labels:
                median = statistics.median(rate for rate, _ in got[label])
                cells = [u for _, u in got[label] if u is not None]
                per_op = f"{statistics.median(cells):6.1f} µs CPU/op" if cells else " " * 16
                print(f"  {label:58} {median:10,.0f}/s {per_op}  {median / native:.2f}x nats-py")
    finally:
        procs.stop_all()
        nats.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
