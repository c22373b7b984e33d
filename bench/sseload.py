"""SSE fan-out load: N clients on one asyncio loop (uvloop) in a process of its own.

Each client is one keep-alive HTTP/1.1 connection (bench.http1, httptools parser) reading an
event stream. For every ``put`` event it records the event id (the KV revision) and the
monotonic clock at the moment its bytes were handed to the process (CLOCK_MONOTONIC is
system-wide on Linux, so the updater in another process stamps puts on the same clock).

Protocol with the driver (bench.run), line based:
  stdout ``READY <ready> <failed>`` once every client has its ``ready`` event, or failed, or
  ``--ready-timeout`` passed;
  stdin  ``STOP <last_revision> <grace_s>``: wait until every connected client has seen
  ``last_revision`` (or ``grace_s`` passed), write the results to ``--out`` and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from urllib.parse import urlsplit

import orjson

from bench.http1 import Connection
from bench.stats import install_uvloop


class Client:
    __slots__ = ("buf", "closed", "conn", "error", "events", "last_id", "ready", "status")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.buf = b""
        self.ready = False
        self.status = 0
        self.events: list[tuple[int, float]] = []
        self.last_id = 0
        self.closed = False
        self.error: str | None = None

    def on_headers(self, status: int) -> None:
        self.status = status

    def sink(self, chunk: bytes) -> None:
        if self.status != 200:
            # An error answer (problem+json): keep its start for the report.
            self.error = ((self.error or f"HTTP {self.status}: ") + chunk.decode(errors="replace"))[
                :300
            ]
            return
        now = time.monotonic()
        buf = self.buf + chunk.replace(b"\r\n", b"\n")
        *blocks, self.buf = buf.split(b"\n\n")
        for block in blocks:
            event = b"message"
            ident = None
            for line in block.split(b"\n"):
                if line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line.startswith(b"id:"):
                    ident = line[3:].strip()
            if event == b"put" and ident:
                rev = int(ident)
                self.events.append((rev, now))
                self.last_id = max(self.last_id, rev)
            elif event == b"ready":
                self.ready = True
            elif event == b"error":
                self.error = block.decode(errors="replace")[:300]


async def run(args: argparse.Namespace) -> None:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    clients = [Client() for _ in range(args.clients)]
    limit = asyncio.Semaphore(args.connect_concurrency)
    errors: dict[str, int] = {}

    async def start(client: Client) -> None:
        async with limit:
            try:
                client.conn = await Connection.open(host, port)
                raw = client.conn.build("GET", args.path, headers={"Accept": "text/event-stream"})
            except OSError as exc:
                client.error = f"connect: {exc!r}"
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
        try:
            status, _ = await client.conn.send(raw, client.sink, client.on_headers)
            # The stream ended (server closed it, or an error status with a body).
            if client.status != 200 and not client.error:
                client.error = f"HTTP {status}"
        except Exception as exc:  # noqa: BLE001
            client.error = client.error or repr(exc)[:200]
        client.closed = True

    t_start = time.monotonic()
    tasks = [asyncio.ensure_future(start(c)) for c in clients]
    deadline = t_start + args.ready_timeout
    while time.monotonic() < deadline:
        if all(c.ready or c.closed or c.error for c in clients):
            break
        await asyncio.sleep(0.05)
    ready = sum(c.ready for c in clients)
    failed = len(clients) - ready
    connect_s = time.monotonic() - t_start
    sys.stdout.write(f"READY {ready} {failed}\n")
    sys.stdout.flush()

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    line = (await reader.readline()).decode().split()
    last_rev, grace = (int(line[1]), float(line[2])) if len(line) >= 3 else (0, 0.0)
    deadline = time.monotonic() + grace
    live = [c for c in clients if c.ready]
    while time.monotonic() < deadline:
        if all(c.last_id >= last_rev or c.closed for c in live):
            break
        await asyncio.sleep(0.02)

    by_rev: dict[int, list[float]] = {}
    for c in clients:
        for rev, t in c.events:
            by_rev.setdefault(rev, []).append(t)
    result = {
        "clients": args.clients,
        "ready": ready,
        "failed": failed,
        "connect_seconds": connect_s,
        "closed_early": sum(1 for c in live if c.closed),
        "errors": errors,
        "error_samples": sorted({c.error for c in clients if c.error})[:5],
        "events": {str(k): v for k, v in by_rev.items()},
    }
    _write(args.out, orjson.dumps(result))
    for c in clients:
        if c.conn is not None:
            c.conn.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    sys.stdout.write("DONE\n")
    sys.stdout.flush()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--ready-timeout", type=float, default=120)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


if __name__ == "__main__":
    install_uvloop()
    asyncio.run(run(parse()))
