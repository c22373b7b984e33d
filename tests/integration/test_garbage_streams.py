"""KV watches and batch Direct Get reads leave no reference cycles, and many of them leave the
process's memory where it was.

A watch that ended left its feed and the feed's ordered consumer holding each other (15
objects per watch with a feed of its own), and every batch Direct Get page nats-py's message
iterator and its subscription (10 objects): garbage only the collector frees, walking every
young object each time. The app is driven in-process, straight through ASGI (an HTTP server
would cost more than the requests), and for the volume runs through its services.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import nats
import pytest

from app.direct.service import SingleQuery
from app.kv.watch import WatchOptions
from app.main import create_app
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings

WATCHES = 50_000
READS = 10_000
# Per operation, of objects the collector found in cycles: before the fixes 15 per watch with
# a feed of its own and 10 per batch read; this leaves room for the odd object of the
# event loop's and the test's own.
CYCLES_PER_OP = 0.05
RSS_SLACK = 4 * 1024 * 1024


class App:
    """The gateway's ASGI app with its lifespan running, called without a server."""

    def __init__(self, app: Any, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.runtime = state["runtime"]

    async def get(self, path: str, query: str = "", *, first_chunk_only: bool = False) -> int:
        """GET, as a client that reads the response (or only its first chunk, then leaves)."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": [(b"host", b"gateway")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
            "state": self.state,
        }
        done = asyncio.Event()
        status = 0
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and (
                first_chunk_only or not message.get("more_body")
            ):
                done.set()

        await self.app(scope, receive, send)
        return status


@asynccontextmanager
async def gateway(url: str) -> AsyncIterator[App]:
    app = create_app(gateway_settings(url))
    async with app.router.lifespan_context(app) as state:
        yield App(app, state)


@contextmanager
def cyclic_garbage() -> Iterator[list[int]]:
    """Objects the collector finds in cycles while the block runs (and at its end)."""
    found = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            found[0] += info["collected"]

    gc.collect()
    gc.callbacks.append(count)
    try:
        yield found
        gc.collect()
    finally:
        gc.callbacks.remove(count)


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.fixture
async def store(nc: nats.NATS, name: str) -> str:
    js = nc.jetstream()
    await js.create_key_value(bucket=name)
    await js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=True)
    for i in range(3):
        await js.publish(f"{name}.{i}", b"x" * 100)
    return name


async def idle_garbage(seconds: float) -> int:
    """Objects in cycles that the process makes while this test does nothing, over
    ``seconds``: what other work of the process leaves (a gateway of an earlier test still
    shutting down in the same pytest process, say), not the operations measured."""
    with cyclic_garbage() as found:
        await asyncio.sleep(seconds)
    return found[0]


async def _per_op(count: int, operation: Callable[[], Any]) -> float:
    """Objects in cycles per operation, beyond the process's idle rate over as long."""
    started = time.monotonic()
    with cyclic_garbage() as found:
        for _ in range(count):
            await operation()
    idle = await idle_garbage(time.monotonic() - started)
    return max(found[0] - idle, 0) / count


@pytest.mark.server("2.11")
async def test_http_watches_and_batch_reads_leave_no_cycles(
    nats_server: EmbeddedServer, store: str
) -> None:
    name = store
    async with gateway(nats_server.url) as app:
        # A watch kept open: the others join its feed.
        kept = asyncio.ensure_future(app.get(f"/v1/kv/{name}/watch", "updates_only=true"))
        watch, own, batch = f"/v1/kv/{name}/watch", "key=own", "seq=1&batch=2"
        try:
            for _ in range(20):  # warm: lazily built stacks, caches
                assert await app.get(watch, "updates_only=true", first_chunk_only=True) == 200
                assert await app.get(watch, own, first_chunk_only=True) == 200
                assert await app.get(f"/v1/streams/{name}/direct", batch) == 200
            shared = await _per_op(
                500, lambda: app.get(watch, "updates_only=true", first_chunk_only=True)
            )
            alone = await _per_op(200, lambda: app.get(watch, own, first_chunk_only=True))
            reads = await _per_op(300, lambda: app.get(f"/v1/streams/{name}/direct", batch))
        finally:
            kept.cancel()
            with pytest.raises(asyncio.CancelledError):
                await kept
    assert shared <= CYCLES_PER_OP, f"{shared:.2f} objects in cycles per watch on a shared feed"
    assert alone <= CYCLES_PER_OP, f"{alone:.2f} objects in cycles per watch with its own feed"
    assert reads <= CYCLES_PER_OP, f"{reads:.2f} objects in cycles per batch Direct Get read"


@pytest.mark.server("2.11")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
async def test_many_watches_and_batch_reads_leave_rss_flat(
    nats_server: EmbeddedServer, store: str
) -> None:
    name = store
    async with gateway(nats_server.url) as app:
        kv, direct = app.runtime.kv, app.runtime.direct_service
        kept = await kv.watch(name, WatchOptions(updates_only=True), None)
        shared, own = WatchOptions(updates_only=True), WatchOptions(key_filter="own")

        async def watch(i: int) -> None:
            # One in a hundred with a feed (an ordered consumer in NATS) of its own.
            session = await kv.watch(name, own if i % 100 == 0 else shared, None)
            assert await session.next_chunk()  # its ready event
            await session.close()

        async def read() -> None:
            items = direct.batch(name, SingleQuery(seq=1), limit=2, max_bytes=None)
            # Two messages (a page), then the end of batch.
            assert [len(item) if isinstance(item, list) else -1 async for item in items] == [2, -1]

        try:
            for i in range(1000):  # warm: allocator arenas, metrics' label children
                await watch(i)
            for _ in range(300):
                await read()
            gc.collect()
            before = rss()
            started = time.monotonic()
            with cyclic_garbage() as found:
                for i in range(WATCHES):
                    await watch(i)
                for _ in range(READS):
                    await read()
            grown = rss() - before
            idle = await idle_garbage(time.monotonic() - started)
        finally:
            await kept.close()
    per_op = max(found[0] - idle, 0) / (WATCHES + READS)
    assert per_op <= CYCLES_PER_OP / 5, f"{per_op:.3f} objects in cycles per operation"
    assert grown <= RSS_SLACK, f"RSS grew by {grown / 2**20:.1f} MiB"
