"""The opt-in KV read cache (JSGW_KV_CACHE): answers from memory, never older than what this
gateway wrote, expiring what the server expires silently, and only while it is live."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway

NATS_REQUESTS = re.compile(
    r'^jsgw_nats_request_duration_seconds_count\{operation="(?!kv\.cache_check")[^}]*\} (\S+)$',
    re.MULTILINE,
)


async def nats_requests(gateway: httpx.AsyncClient) -> float:
    """NATS requests made so far, of any operation (Direct Get, or MSG.GET without it) but the
    cache's own periodic check of the stream."""
    return sum(map(float, NATS_REQUESTS.findall((await gateway.get("/metrics")).text)))


async def until_cached(gateway: httpx.AsyncClient, path: str) -> httpx.Response:
    """Read until a read costs no NATS request and finds the key (the cache is live and the
    watch has delivered the key: writes by others arrive after a delivery lag)."""
    for _ in range(100):
        before = await nats_requests(gateway)
        response = await gateway.get(path)
        if await nats_requests(gateway) == before and response.status_code == 200:
            return response
        await asyncio.sleep(0.05)
    raise AssertionError("the cache never answered")


@pytest.fixture
async def cached(nats_server: EmbeddedServer, name: str) -> AsyncIterator[httpx.AsyncClient]:
    nc = await nats.connect(nats_server.url)
    await nc.jetstream().create_key_value(bucket=name, history=5)
    await nc.close()
    settings = gateway_settings(nats_server.url, kv_cache=[name, "other"])
    async with running_gateway(settings) as gateway:
        yield gateway


async def test_reads_come_from_memory_and_follow_outside_writes(
    cached: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    kv = await nc.jetstream().key_value(name)
    revision = await kv.put("a", b"one")
    first = await until_cached(cached, f"/v1/kv/{name}/keys/a")
    assert first.status_code == 200 and first.content == b"one"
    assert first.headers["kv-revision"] == str(revision)
    # The same answer as Direct Get (a query string takes the regular path, and NATS).
    direct = await cached.get(f"/v1/kv/{name}/keys/a", params={"via": "nats"})
    for header in ("etag", "kv-revision", "kv-created", "kv-operation"):
        assert first.headers[header] == direct.headers[header], header
    before = await nats_requests(cached)
    for _ in range(20):
        assert (await cached.get(f"/v1/kv/{name}/keys/a")).content == b"one"
    problem(await cached.get(f"/v1/kv/{name}/keys/never"), 404, "kv.key_not_found")
    assert await nats_requests(cached) == before  # 21 reads, none to NATS
    # Written by another client: seen once the watch delivers it.
    await kv.put("a", b"two")
    await kv.delete("b")
    # The watch applies the put, then the delete (b had no value before: 404 all along, but
    # naming its DEL marker only once the delete is in).
    for _ in range(100):
        if (await cached.get(f"/v1/kv/{name}/keys/a")).content == b"two" and (
            (await cached.get(f"/v1/kv/{name}/keys/b")).json().get("operation") == "DEL"
        ):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the cache kept the old values")
    gone = problem(await cached.get(f"/v1/kv/{name}/keys/b"), 404, "kv.key_not_found")
    assert gone["operation"] == "DEL"


async def test_a_write_through_the_gateway_is_read_back_at_once(
    cached: httpx.AsyncClient, name: str
) -> None:
    path = f"/v1/kv/{name}/keys/counter"
    await cached.put(path, content=b"0")
    await until_cached(cached, path)
    for i in range(1, 60):
        written = await cached.put(path, content=str(i).encode())
        read = await cached.get(path)
        assert read.content == str(i).encode()
        assert read.headers["kv-revision"] == str(written.json()["revision"])
        if i % 10 == 0:
            assert (await cached.delete(path)).status_code == 204
            problem(await cached.get(path), 404, "kv.key_not_found")


@pytest.mark.server("2.11")
async def test_expired_keys_are_not_answered_from_memory(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """Values of a bucket with a ttl (max_age) and no limit markers expire silently: the cache
    must not serve one after its expiry."""
    await nc.jetstream().create_key_value(bucket=name, ttl=1)
    settings = gateway_settings(nats_server.url, kv_cache=[name])
    async with running_gateway(settings) as gateway:
        path = f"/v1/kv/{name}/keys/session"
        assert (await gateway.put(path, content=b"token")).status_code == 200
        assert (await until_cached(gateway, path)).content == b"token"
        await asyncio.sleep(1.3)
        problem(await gateway.get(path), 404, "kv.key_not_found")


async def test_a_bucket_over_the_cap_is_read_from_nats(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    kv = await nc.jetstream().create_key_value(bucket=name)
    await kv.put("big", b"x" * 2000)
    settings = gateway_settings(nats_server.url, kv_cache=[name], kv_cache_max_bytes=1000)
    async with running_gateway(settings) as gateway:
        await asyncio.sleep(0.5)  # the cache has started, and given up on this bucket
        for _ in range(10):
            before = await nats_requests(gateway)
            assert (await gateway.get(f"/v1/kv/{name}/keys/big")).status_code == 200
            assert await nats_requests(gateway) >= before + 1


def test_cached_bucket_names_are_checked() -> None:
    from pydantic import ValidationError

    from app.config import Settings

    assert Settings(kv_cache="a, b").kv_cache == ["a", "b"]  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings(kv_cache="a.b")  # type: ignore[arg-type]


async def test_closing_while_the_feed_starts_leaves_no_consumer(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.kv.cache import BucketCache
    from app.metrics import Metrics
    from app.nats.jsapi import JetStreamApi
    from app.nats.ordered import OrderedConsumer
    from app.nats.pool import NatsPool

    await nc.jetstream().create_key_value(bucket=name)
    created = asyncio.Event()
    original = OrderedConsumer._watch_deletion

    async def watch_then_hang(self, client, generation):  # type: ignore[no-untyped-def]
        # The consumer exists; its start is not over when the gateway closes.
        advisory = await original(self, client, generation)
        created.set()
        await asyncio.sleep(60)
        return advisory

    monkeypatch.setattr(OrderedConsumer, "_watch_deletion", watch_then_hang)
    pool = NatsPool(gateway_settings(nats_server.url), [nats_server.url], Metrics())
    await pool.start()
    try:
        cache = BucketCache(JetStreamApi(pool), name, 5.0, 1 << 20)
        cache.start()
        await asyncio.wait_for(created.wait(), 10)
        assert (await nc.jetstream().stream_info(f"KV_{name}")).state.consumer_count == 1
        await cache.close()
        assert (await nc.jetstream().stream_info(f"KV_{name}")).state.consumer_count == 0
    finally:
        await pool.close()


PURGE_HEARTBEAT = 0.5


@pytest.mark.parametrize("purge", ["stream", "subject", "purge_deletes"])
async def test_a_purge_by_other_means_is_seen_within_two_heartbeats(
    nats_server: EmbeddedServer,
    nc: nats.NATS,
    name: str,
    purge: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stream purge tells consumers nothing: the cache stops answering what it removed
    within the bound docs/api/kv.md gives (two JSGW_KV_WATCH_HEARTBEAT intervals), then caches
    again."""
    caplog.set_level(logging.INFO, "jsgw.kv.cache")
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=name, history=5)
    await kv.put("a", b"one")
    await kv.put("b", b"two")
    if purge == "purge_deletes":
        await kv.delete("a")  # cached as deleted: 404 with the delete's operation
    settings = gateway_settings(
        nats_server.url, kv_cache=[name], kv_watch_heartbeat=PURGE_HEARTBEAT
    )
    path = f"/v1/kv/{name}/keys/a"
    async with running_gateway(settings) as gateway:
        await until_cached(gateway, f"/v1/kv/{name}/keys/b")

        async def stale() -> bool:
            answer = await gateway.get(path)
            if purge == "purge_deletes":
                return "operation" in problem(answer, 404, "kv.key_not_found")
            return answer.status_code == 200

        assert await stale()
        if purge == "stream":
            await js.purge_stream(f"KV_{name}")
        elif purge == "subject":
            await js.purge_stream(f"KV_{name}", subject=f"$KV.{name}.a")
        else:
            await kv.purge_deletes(olderthan=-1)
        purged = time.monotonic()
        while await stale():
            assert time.monotonic() - purged < 2 * PURGE_HEARTBEAT + 1, "still the purged entry"
            await asyncio.sleep(0.02)
        took = time.monotonic() - purged
        problem(await gateway.get(path), 404, "kv.key_not_found")
        assert took <= 2 * PURGE_HEARTBEAT + 0.3, f"seen after {took:.2f} s"
        # Caching again, from what the stream holds now; and no more reloads.
        if purge == "stream":
            await kv.put("b", b"three")
        expected = b"three" if purge == "stream" else b"two"
        assert (await until_cached(gateway, f"/v1/kv/{name}/keys/b")).content == expected
        await asyncio.sleep(3 * PURGE_HEARTBEAT)
        before = await nats_requests(gateway)
        assert (await gateway.get(f"/v1/kv/{name}/keys/b")).content == expected
        problem(await gateway.get(path), 404, "kv.key_not_found")
        assert await nats_requests(gateway) == before
    reloads = [r for r in caplog.records if "lost keys" in r.getMessage()]
    assert len(reloads) == 1, [r.getMessage() for r in reloads]


async def test_keys_expiring_do_not_look_like_a_purge(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server removes expired values on its own: the cache's check must not take that for
    a purge (and reload the bucket over and over)."""
    caplog.set_level(logging.INFO, "jsgw.kv.cache")
    kv = await nc.jetstream().create_key_value(bucket=name, ttl=1)
    settings = gateway_settings(
        nats_server.url, kv_cache=[name], kv_watch_heartbeat=PURGE_HEARTBEAT
    )
    async with running_gateway(settings) as gateway:
        for i in range(8):  # keys expiring while others are written and read from memory
            await kv.put(f"k{i}", b"v")
            await until_cached(gateway, f"/v1/kv/{name}/keys/k{i}")
            await asyncio.sleep(PURGE_HEARTBEAT)
    assert not [r for r in caplog.records if "lost keys" in r.getMessage()]
