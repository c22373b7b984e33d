"""Interop with nats-py's own KV API, both ways: same buckets, revisions, values, operations."""

from __future__ import annotations

import asyncio
import base64

import httpx
import nats
import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from tests.helpers import problem
from tests.integration.test_kv_buckets import make_bucket
from tests.integration.test_kv_watch import bucket as make_served_bucket
from tests.integration.test_kv_watch import client, watching  # noqa: F401 (fixtures)

JSON_ACCEPT = {"Accept": "application/json"}


async def stored_operations(nc: nats.NATS, bucket: str, key: str) -> list[str]:
    """The KV operation of each stored message of ``key``, oldest first, read one message get
    at a time. (nats-py's ``KeyValue.history`` can come back empty for a key with one
    message: its watcher takes a consumer info saying nothing is pending for the end when the
    message has been delivered but not yet handed to it.)"""
    js = nc.jetstream()
    operations: list[str] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(
                f"KV_{bucket}", seq=seq, subject=f"$KV.{bucket}.{key}", next=True
            )
        except nats.js.errors.NotFoundError:
            return operations
        operations.append((msg.headers or {}).get("KV-Operation", "PUT"))
        seq = (msg.seq or seq) + 1


async def keys_by_nats_py(kv: KeyValue) -> list[str]:
    """nats-py's ``KeyValue.keys()``, sorted; asked again when it finds none, since its watcher
    has the race :func:`stored_operations` describes (which only ever ends it before the
    first key)."""
    for _ in range(3):
        try:
            return sorted(await kv.keys())
        except nats.js.errors.NoKeysError:
            continue
    return []


async def test_gateway_writes_read_by_nats_py(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=5)
    kv = await nc.jetstream().key_value(name)
    status = await kv.status()
    assert status.history == 5 and status.stream_info.config.allow_direct is True

    revision = (await gateway.put(f"/v1/kv/{name}/keys/cfg.db", content=b"postgres://")).json()
    entry = await kv.get("cfg.db")
    assert (entry.revision, entry.value) == (revision["revision"], b"postgres://")

    created = await gateway.put(
        f"/v1/kv/{name}/keys/cfg.new", content=b"n", headers={"If-None-Match": "*"}
    )
    assert (await kv.get("cfg.new")).revision == created.json()["revision"]
    await gateway.put(
        f"/v1/kv/{name}/keys/cfg.db",
        content=b"mysql://",
        headers={"If-Match": f'"{revision["revision"]}"'},
    )
    assert (await kv.get("cfg.db")).value == b"mysql://"

    await gateway.delete(f"/v1/kv/{name}/keys/cfg.new")
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("cfg.new")
    await gateway.delete(f"/v1/kv/{name}/keys/cfg.db?purge=true")
    assert await stored_operations(nc, name, "cfg.db") == ["PURGE"]
    # nats-py's Create works over the key the gateway deleted, like the gateway's does.
    assert await kv.create("cfg.new", b"again") == 6
    assert await keys_by_nats_py(kv) == ["cfg.new"]


async def test_nats_py_writes_read_by_the_gateway(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=5)
    kv = await nc.jetstream().key_value(name)
    one = await kv.put("user.1", b"alice")
    two = await kv.update("user.1", b"alicia", last=one)
    await kv.put("user.2", b"bob")
    await kv.delete("user.2")
    await kv.create("user.3", b"carol")
    await kv.purge("user.3")

    got = await gateway.get(f"/v1/kv/{name}/keys/user.1", headers=JSON_ACCEPT)
    assert got.json()["revision"] == two and base64.b64decode(got.json()["value"]) == b"alicia"
    old = await gateway.get(f"/v1/kv/{name}/keys/user.1", params={"revision": one})
    assert old.content == b"alice"
    problem(await gateway.get(f"/v1/kv/{name}/keys/user.2"), 404, "kv.key_not_found")
    history = (await gateway.get(f"/v1/kv/{name}/history/user.2")).json()["entries"]
    assert [e["operation"] for e in history] == ["PUT", "DEL"]
    assert (await gateway.get(f"/v1/kv/{name}/keys")).json()["keys"] == ["user.1"]
    stale = problem(
        await gateway.put(
            f"/v1/kv/{name}/keys/user.1", content=b"x", headers={"If-Match": f'"{one}"'}
        ),
        412,
        "kv.revision_mismatch",
    )
    assert stale["revision"] == two
    recreated = await gateway.put(
        f"/v1/kv/{name}/keys/user.3", content=b"c", headers={"If-None-Match": "*"}
    )
    assert recreated.status_code == 201


async def test_watch_sees_nats_py_writes_and_nats_py_sees_gateway_writes(
    client: httpx.AsyncClient,  # noqa: F811 - test_kv_watch's fixture, imported above
    nc: nats.NATS,
    name: str,
) -> None:
    await make_served_bucket(client, name)
    kv = await nc.jetstream().key_value(name)
    watcher = await kv.watchall()
    assert await watcher.updates(timeout=2) is None  # nats-py's end of initial data
    async with watching(client, name) as sse:
        await sse.until("ready")
        revision = await kv.put("from.nats-py", b"hi")
        event = await sse.next()
        assert (event.event, event.id) == ("put", str(revision))
        assert base64.b64decode(event.json["value"]) == b"hi"
        await kv.delete("from.nats-py")
        assert (await sse.next()).event == "delete"

        written = await client.put(f"/v1/kv/{name}/keys/from.gateway", content=b"yo")
        seen = [await watcher.updates(timeout=2) for _ in range(3)]
        assert [(e.key, e.operation) for e in seen] == [
            ("from.nats-py", None),
            ("from.nats-py", "DEL"),
            ("from.gateway", None),
        ]
        assert seen[-1].revision == written.json()["revision"] and seen[-1].value == b"yo"
        assert (await sse.next()).json["key"] == "from.gateway"
    await watcher.stop()


async def test_a_bucket_made_by_nats_py_without_direct_get(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, nats_release: tuple[int, int]
) -> None:
    """nats-py leaves allow_direct off: the gateway reads as ADR-8 says for such buckets."""
    kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket=name, history=4))
    assert (await kv.status()).stream_info.config.allow_direct is False
    first = await kv.put("a", b"1")
    await kv.put("a", b"2")
    await kv.put("b", b"x")
    await kv.delete("b")
    status = (await gateway.get(f"/v1/kv/{name}")).json()
    assert status["allow_direct"] is False and status["history"] == 4

    assert (await gateway.get(f"/v1/kv/{name}/keys/a")).content == b"2"
    assert (await gateway.get(f"/v1/kv/{name}/keys/a", params={"revision": first})).content == b"1"
    problem(
        await gateway.get(f"/v1/kv/{name}/keys/a", params={"revision": 3}), 404, "kv.key_not_found"
    )
    problem(await gateway.get(f"/v1/kv/{name}/keys/b"), 404, "kv.key_not_found")
    history = (await gateway.get(f"/v1/kv/{name}/history/a")).json()["entries"]
    assert [(e["revision"], e["delta"]) for e in history] == [(1, 1), (2, 0)]
    assert (await gateway.get(f"/v1/kv/{name}/keys")).json()["keys"] == ["a"]
    created = await gateway.put(
        f"/v1/kv/{name}/keys/b", content=b"y", headers={"If-None-Match": "*"}
    )
    assert created.status_code == 201
    assert (await kv.get("b")).value == b"y"

    # Updating it through the gateway makes it ADR-8's, without touching nats-py's TTL switch.
    updated = await gateway.put(f"/v1/kv/{name}", json={"history": 4})
    assert updated.status_code == 200 and updated.json()["allow_direct"] is True
    info = await nc.jetstream().stream_info(f"KV_{name}")
    assert bool(info.config.allow_msg_ttl) is (nats_release >= (2, 11))  # unknown to 2.10
    assert (await gateway.get(f"/v1/kv/{name}/keys/b")).content == b"y"


async def test_watch_on_a_bucket_without_direct_get(
    client: httpx.AsyncClient,  # noqa: F811 - test_kv_watch's fixture, imported above
    nc: nats.NATS,
    name: str,
) -> None:
    kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket=name))
    await kv.put("k", b"v")
    async with watching(client, name) as sse:
        events = await sse.until("ready")
        assert [(e.event, e.id) for e in events] == [("put", "1"), ("ready", "1")]
        await asyncio.sleep(0)
        await kv.put("k", b"w")
        assert (await sse.next()).id == "2"
