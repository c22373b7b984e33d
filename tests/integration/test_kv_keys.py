"""Key listings: filters, deletes left out, cursor paging that stays cheap on large buckets."""

from __future__ import annotations

import asyncio
import time

import httpx
import nats

from tests.helpers import problem
from tests.integration.test_kv_buckets import make_bucket

BOTH_PATHS = True  # every test with the gateway fixture runs with JSGW_LEAN_PATHS on and off


async def all_keys(gw: httpx.AsyncClient, bucket: str, **params: object) -> tuple[list[str], int]:
    """Every page of a listing: (keys in order, number of requests)."""
    keys: list[str] = []
    cursor: str | None = None
    requests = 0
    while True:
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        response = await gw.get(f"/v1/kv/{bucket}/keys", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        requests += 1
        keys.extend(page["keys"])
        cursor = page["next_cursor"]
        if cursor is None:
            return keys, requests


async def bulk_put(nc: nats.NATS, bucket: str, keys: list[str], value: bytes = b"v") -> None:
    """Many writes fast: acknowledged publishes, 1,000 in flight (a busy server may drop core
    publishes: a 2.11.11 run on a loaded machine lost some, and the writes never all came)."""
    js = nc.jetstream()
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        await asyncio.gather(*(js.publish(f"$KV.{bucket}.{key}", value) for key in chunk))


async def test_filters_and_deleted_keys(gateway: httpx.AsyncClient, name: str) -> None:
    await make_bucket(gateway, name)
    for key in ("a.1", "a.2", "a.b.3", "b.1", "c"):
        await gateway.put(f"/v1/kv/{name}/keys/{key}", content=b"v")
    await gateway.delete(f"/v1/kv/{name}/keys/a.2")
    await gateway.delete(f"/v1/kv/{name}/keys/c?purge=true")

    everything = (await gateway.get(f"/v1/kv/{name}/keys")).json()
    assert sorted(everything["keys"]) == ["a.1", "a.b.3", "b.1"]
    assert everything["next_cursor"] is None
    assert sorted((await gateway.get(f"/v1/kv/{name}/keys?filter=a.*")).json()["keys"]) == ["a.1"]
    assert sorted((await gateway.get(f"/v1/kv/{name}/keys?filter=a.>")).json()["keys"]) == [
        "a.1",
        "a.b.3",
    ]
    assert (await gateway.get(f"/v1/kv/{name}/keys?filter=*.1")).json()["keys"] == ["a.1", "b.1"]
    assert (await gateway.get(f"/v1/kv/{name}/keys?filter=b.1")).json()["keys"] == ["b.1"]
    assert (await gateway.get(f"/v1/kv/{name}/keys?filter=zzz")).json() == {
        "keys": [],
        "next_cursor": None,
    }
    await gateway.put(f"/v1/kv/{name}/keys/a.2", content=b"back")
    assert sorted((await gateway.get(f"/v1/kv/{name}/keys?filter=a.*")).json()["keys"]) == [
        "a.1",
        "a.2",
    ]
    for bad in ("a.>.b", "a b", ".a", "a..b", "a.%0A", "*x"):
        problem(
            await gateway.get(f"/v1/kv/{name}/keys", params={"filter": bad}),
            400,
            "kv.key_filter_invalid",
        )
    for bad in ("x", "-1", "1.5", "1\n", str(2**64 - 1)):
        problem(
            await gateway.get(f"/v1/kv/{name}/keys", params={"cursor": bad}),
            400,
            "kv.cursor_invalid",
        )
    for bad in ("0", "10001", "x"):
        problem(await gateway.get(f"/v1/kv/{name}/keys", params={"limit": bad}), 400)


async def test_paging_with_history_lists_each_live_key_once(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """History > 1: a key's older revisions and later deletes must not list it (again)."""
    await make_bucket(gateway, name, history=5)
    keys = [f"k.{i:03d}" for i in range(60)]
    await bulk_put(nc, name, keys)
    await bulk_put(nc, name, [f"k.{i:03d}" for i in range(0, 60, 2)])  # even keys: revision 2
    for i in range(0, 60, 3):  # every third key deleted afterwards
        await gateway.delete(f"/v1/kv/{name}/keys/k.{i:03d}")
    live = sorted(k for i, k in enumerate(keys) if i % 3)
    listed, requests = await all_keys(gateway, name, limit=7)
    assert sorted(listed) == live
    assert len(listed) == len(set(listed))
    assert requests >= len(live) // 7


async def test_large_bucket_pages_cost_the_same_at_any_depth(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """20k keys, 1000 a page: every key once, and the last page is no slower than the first."""
    await make_bucket(gateway, name)
    total = 20_000
    keys = [f"user.{i:05d}" for i in range(total)]
    await bulk_put(nc, name, keys)
    for i in range(0, total, 10):  # 2000 deleted keys
        await nc.publish(f"$KV.{name}.user.{i:05d}", b"", headers={"KV-Operation": "DEL"})
    await nc.flush()
    await asyncio.sleep(0.2)

    timings: list[float] = []
    listed: list[str] = []
    cursor: str | None = None
    started = time.perf_counter()
    while True:
        params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        before = time.perf_counter()
        page = (await gateway.get(f"/v1/kv/{name}/keys", params=params)).json()
        timings.append(time.perf_counter() - before)
        listed.extend(page["keys"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    elapsed = time.perf_counter() - started
    assert len(listed) == len(set(listed)) == total - total // 10
    assert set(listed) == {k for i, k in enumerate(keys) if i % 10}
    # The best of three pages at each end (the machine may be busy); the very last page is
    # left out: it reads the 2,000 delete markers, which sit at the end of the stream.
    first, deepest = min(timings[:3]), min(timings[-4:-1])
    print(
        f"\nkeys listing: {total} keys ({total // 10} deleted), {len(timings)} pages of 1000 in "
        f"{elapsed:.2f}s; median page {sorted(timings)[len(timings) // 2] * 1000:.1f} ms, "
        f"best early page {first * 1000:.1f} ms, best deep page {deepest * 1000:.1f} ms"
    )
    # A page costs the same at any depth: nothing before the cursor is read again.
    assert deepest < max(4 * first, 0.3)
    one_request = await gateway.get(f"/v1/kv/{name}/keys", params={"limit": 10_000})
    assert len(one_request.json()["keys"]) == 10_000 and one_request.json()["next_cursor"]
