"""The cost of one access log line: the old ``logging`` path against ``app.accesslog.AccessLog``.

Both write the same line for the same request fields, as the middleware does after each
request, to the same place: ``/dev/null`` (opened as stderr is: line-buffered text for
``logging``), or with ``--pipe`` a pipe read by a ``cat`` process (as a container runtime or
a process supervisor reads stderr). Reported: CPU µs per line of this process (every thread:
the writer thread's work is counted) and, for the new writer, of the event-loop thread alone.

Run: ``python -m bench.accesslog [--lines 200000] [--rounds 3] [--pipe]``.

With ``--http SECONDS`` it measures instead the whole gateway's CPU per KV GET (wrk, 64
connections, 1,000 keys of 100 bytes, ``--workers 1``) with the access log on and off, in
interleaved rounds, each gateway a ``python -m app serve`` of this checkout with its stderr in
a file; ``--before DIR`` adds one more gateway, access log on, run from another checkout (the
code before this writer, e.g. ``git archive <commit> | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.accesslog import AccessLog
from app.logs import JsonFormatter

FIELDS = {
    "request_id": "3f9a1c0e5b7d2a4c6e8f0a1b00000001",
    "method": "GET",
    "path": "/v1/kv/orders/keys/customer.1234",
    "route": "/v1/kv/{bucket}/keys/{key}",
    "status": 200,
    "client": ("127.0.0.1", 51234),
}


@contextmanager
def target(pipe: bool) -> Iterator[int]:
    """A descriptor to write the lines to."""
    if not pipe:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            yield fd
        finally:
            os.close(fd)
        return
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    try:
        yield reader.stdin.fileno()
    finally:
        reader.stdin.close()
        reader.wait()


def old_path(fd: int, lines: int) -> float:
    """CPU seconds for ``lines`` lines through logging, as the middleware wrote them."""
    logger = logging.getLogger("bench.jsgw.access")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    f = FIELDS
    with open(os.dup(fd), "w", buffering=1) as stream:  # as stderr: line-buffered text
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter())
        logger.handlers[:] = [handler]
        started = time.process_time()
        for _ in range(lines):
            begun = time.perf_counter()
            client = f["client"]
            logger.info(
                "%s %s %s",
                f["method"],
                f["path"],
                f["status"],
                extra={
                    "request_id": f["request_id"],
                    "method": f["method"],
                    "path": f["path"],
                    "route": f["route"],
                    "status": f["status"],
                    "duration_ms": round((time.perf_counter() - begun) * 1000, 3),
                    "client": f"{client[0]}:{client[1]}" if client else None,  # type: ignore[index]
                },
            )
        cpu = time.process_time() - started
        logger.handlers.clear()
    return cpu


async def new_path(fd: int, lines: int) -> tuple[float, float]:
    """CPU seconds for ``lines`` lines through AccessLog (the process's, the loop thread's)."""
    access = AccessLog(fd)
    logging.getLogger("jsgw.access").setLevel(logging.INFO)
    f = FIELDS
    started, started_loop = time.process_time(), time.thread_time()
    access.start()
    for i in range(lines):
        begun = time.perf_counter()
        access.request(
            f["request_id"],  # type: ignore[arg-type]
            f["method"],  # type: ignore[arg-type]
            f["path"],  # type: ignore[arg-type]
            f["route"],  # type: ignore[arg-type]
            f["status"],  # type: ignore[arg-type]
            time.perf_counter() - begun,
            f["client"],  # type: ignore[arg-type]
        )
        if i % 64 == 63:  # requests come in over the loop's iterations: let its timers run
            await asyncio.sleep(0)
    loop_cpu = time.thread_time() - started_loop
    access.close()  # everything written
    return time.process_time() - started, loop_cpu


def http(seconds: float, rounds: int, before: Path | None) -> None:
    """CPU µs per KV GET of gateways with the access log on and off (see the module)."""
    import shutil
    import tempfile
    import urllib.request

    from app.nats.embedded import EmbeddedServer
    from bench import wrk
    from bench.procs import PYTHON, ROOT, Procs, cpu_seconds, free_port, wait_http

    binary = wrk.find()
    if binary is None:
        raise SystemExit(f"wrk is not installed ({wrk.INSTALL_HINT})")
    workdir = Path(tempfile.mkdtemp(prefix="jsgw-bench-accesslog-"))
    procs = Procs()
    nats = EmbeddedServer(workdir / "nats", log_file=workdir / "nats.log")
    try:
        url = nats.start()
        gateways: dict[str, tuple[str, int]] = {}
        variants = [("access log on", ROOT, "true"), ("access log off", ROOT, "false")]
        if before is not None:
            variants.append(("before (logging), access log on", before, "true"))
        for name, checkout, access in variants:
            port = free_port()
            env = {
                "PYTHONPATH": str(checkout),
                "JSGW_NATS_URL": url,
                "JSGW_PORT": str(port),
                "JSGW_ACCESS_LOG": access,
                "JSGW_DATA_DIR": str(workdir / f"data-{port}"),
            }
            log_file = workdir / f"gateway-{port}.log"
            proc = procs.start(
                name, [PYTHON, "-m", "app", "serve"], env=env, log=log_file, cwd=checkout
            )
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz", proc, timeout=60)
            gateways[name] = (base, proc.pid)
        base = next(iter(gateways.values()))[0]
        json = {"Content-Type": "application/json"}
        bucket = urllib.request.Request(f"{base}/v1/kv/B", b"{}", json, method="PUT")
        urllib.request.urlopen(bucket).read()
        for i in range(1000):
            request = urllib.request.Request(f"{base}/v1/kv/B/keys/k{i}", b"v" * 100, method="PUT")
            urllib.request.urlopen(request).read()
        lua = wrk.script(
            [("GET", f"/v1/kv/B/keys/k{i}", {}, None) for i in range(1000)], workdir / "get.lua"
        )
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in gateways}
        for round_ in range(rounds):
            order = list(gateways) if round_ % 2 == 0 else list(reversed(gateways))
            for name in order:
                base, pid = gateways[name]
                cpu = cpu_seconds(pid)
                run = wrk.run(binary, base, lua, threads=1, connections=64, duration=seconds)
                cpu = cpu_seconds(pid) - cpu
                assert run["errors"] == 0 and run["non_2xx"] == 0, run
                results[name].append((cpu / run["ops"] * 1e6, run["rate"]))
        print(
            f"KV GET, wrk -t1 -c64, {rounds} rounds of {seconds:g} s; "
            "gateway CPU µs per request (req/s)"
        )
        for name, values in results.items():
            cells = ", ".join(f"{us:.1f} ({rate:,.0f})" for us, rate in values)
            median = statistics.median(us for us, _ in values)
            print(f"  {name:32} median {median:6.1f} µs   rounds: {cells}")
    finally:
        procs.stop_all()
        nats.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipe", action="store_true", help="write to a pipe read by cat")
    parser.add_argument("--http", type=float, metavar="SECONDS", help="KV GET with wrk instead")
    parser.add_argument("--before", type=Path, help="with --http: also this checkout's gateway")
    args = parser.parse_args()
    if args.http:
        http(args.http, args.rounds, args.before)
        return
    old: list[float] = []
    new: list[float] = []
    new_loop: list[float] = []
    with target(args.pipe) as fd:
        for _ in range(args.rounds):  # interleaved, so that both see the same machine
            old.append(old_path(fd, args.lines) / args.lines * 1e6)
            cpu, loop_cpu = asyncio.run(new_path(fd, args.lines))
            new.append(cpu / args.lines * 1e6)
            new_loop.append(loop_cpu / args.lines * 1e6)
    where = "a pipe read by cat" if args.pipe else "/dev/null"
    print(
        f"{args.lines:,} lines x {args.rounds} rounds to {where}; CPU µs per line, median (min-max)"
    )
    for name, values in (
        ("logging + JsonFormatter (before)", old),
        ("AccessLog, whole process", new),
        ("AccessLog, event-loop thread", new_loop),
    ):
        print(
            f"  {name:34} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})"
        )
    print(
        f"  ratio before / after (process): {statistics.median(old) / statistics.median(new):.1f}x"
    )


if __name__ == "__main__":
    main()
