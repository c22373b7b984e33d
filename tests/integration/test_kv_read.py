"""POST /v1/kv/{bucket}/read: several keys as of one revision."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime

import httpx
import nats

from tests.helpers import problem


def values(body: dict) -> dict[str, str | None]:
    return {
        e["key"]: base64.b64decode(e["value"]).decode() if "value" in e else None
        for e in body["entries"]
    }


async def test_users_example_at_every_revision(gateway: httpx.AsyncClient, name: str) -> None:
    assert (await gateway.put(f"/v1/kv/{name}", json={"history": 5})).status_code == 201
    writes = [("1234.name", "Bob"), ("1234.surname", "Smith"), ("1234.address", "1 Main Street")]
    for key, value in writes:
        await gateway.put(f"/v1/kv/{name}/keys/{key}", content=value.encode())
    middle = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await gateway.put(f"/v1/kv/{name}/keys/1234.address", content=b"10 Oak Lane")
    await gateway.delete(f"/v1/kv/{name}/keys/1234.surname")  # revision 5

    async def read(**body: object) -> dict:
        response = await gateway.post(f"/v1/kv/{name}/read", json={"keys": ["1234.>"], **body})
        assert response.status_code == 200, response.text
        return response.json()

    at3 = await read(at_revision=3)
    assert at3["revision"] == 3
    assert values(at3) == {
        "1234.name": "Bob",
        "1234.surname": "Smith",
        "1234.address": "1 Main Street",
    }
    at4 = await read(at_revision=4)
    assert values(at4)["1234.address"] == "10 Oak Lane"
    now = await read()
    assert now["revision"] == 5
    assert values(now) == {"1234.name": "Bob", "1234.address": "10 Oak Lane"}
    with_deleted = await read(include_deleted=True)
    surname = next(e for e in with_deleted["entries"] if e["key"] == "1234.surname")
    assert surname["operation"] == "DEL" and "value" not in surname and surname["revision"] == 5
    by_time = await read(at_time=middle.isoformat())
    assert by_time["revision"] == 3 and values(by_time)["1234.address"] == "1 Main Street"
    explicit = await gateway.post(
        f"/v1/kv/{name}/read", json={"keys": ["1234.name", "1234.nobody"], "at_revision": 2}
    )
    assert values(explicit.json()) == {"1234.name": "Bob"}
    entry = explicit.json()["entries"][0]
    assert set(entry) >= {"bucket", "key", "value", "revision", "created", "operation"}


async def test_more_keys_than_one_server_request(gateway: httpx.AsyncClient, name: str) -> None:
    assert (await gateway.put(f"/v1/kv/{name}", json={})).status_code == 201
    keys = [f"k.{i}" for i in range(1500)]
    batch = [
        {"subject": f"$KV.{name}.{k}", "data": base64.b64encode(k.encode()).decode()} for k in keys
    ]
    for start in range(0, 1500, 500):
        response = await gateway.post("/v1/publish", json={"messages": batch[start : start + 500]})
        assert all(r["ok"] for r in response.json()["results"])
    at = 1000
    body = (
        await gateway.post(f"/v1/kv/{name}/read", json={"keys": keys, "at_revision": at})
    ).json()
    assert body["revision"] == at
    assert values(body) == {k: k for k in keys[:at]}


async def test_times_beyond_the_servers_clock(gateway: httpx.AsyncClient, name: str) -> None:
    """nats-server holds times as nanoseconds in an int64 (1678 to 2262): a time outside
    wrapped around (a read as of 2999 was as of revision 0, one as of 1500 saw everything)."""
    assert (await gateway.put(f"/v1/kv/{name}", json={})).status_code == 201
    for key in ("a", "b", "c"):
        await gateway.put(f"/v1/kv/{name}/keys/{key}", content=key.encode())
    path = f"/v1/kv/{name}/read"
    for later in ("2999-01-01T00:00:00Z", "9999-12-31T23:59:59Z"):
        body = (await gateway.post(path, json={"keys": [">"], "at_time": later})).json()
        assert body["revision"] == 3 and values(body) == {"a": "a", "b": "b", "c": "c"}, body
    for earlier in ("1500-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z"):
        body = (await gateway.post(path, json={"keys": [">"], "at_time": earlier})).json()
        assert body == {"revision": 0, "entries": []}, (earlier, body)


async def test_a_bucket_without_direct_get_is_read_by_consumers(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """ADR-8 allows buckets without Direct Get (``allow_direct`` false): nothing answers a
    multi_last, so the keys are read by consumers of the stream, as of the same revision."""
    await nc.jetstream().create_key_value(bucket=name, history=3, direct=False)
    for key, value in (("a", b"1"), ("b.x", b"2"), ("a", b"3")):
        await gateway.put(f"/v1/kv/{name}/keys/{key}", content=value)
    path = f"/v1/kv/{name}/read"
    for _ in range(2):  # (the second knows the stream allows none: no Direct Get is tried)
        now = await gateway.post(path, json={"keys": ["a", "b.*"]})
        assert now.status_code == 200, now.text
        assert now.json()["revision"] == 3 and values(now.json()) == {"a": "3", "b.x": "2"}
    at = (await gateway.post(path, json={"keys": [">"], "at_revision": 2})).json()
    assert at["revision"] == 2 and values(at) == {"a": "1", "b.x": "2"}
    assert (await gateway.get(f"/v1/streams/KV_{name}/consumers")).json()["total"] == 0


async def test_a_wildcard_over_too_many_keys_is_413(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """As many keys as one multi_last request may match (1,024), by either way of reading."""
    assert (await gateway.put(f"/v1/kv/{name}", json={})).status_code == 201
    batch = [{"subject": f"$KV.{name}.k.{i}", "data": "eA=="} for i in range(1100)]
    for start in range(0, 1100, 550):
        published = await gateway.post("/v1/publish", json={"messages": batch[start : start + 550]})
        assert all(r["ok"] for r in published.json()["results"])
    path = f"/v1/kv/{name}/read"
    problem(await gateway.post(path, json={"keys": ["k.*"]}), 413, "direct.too_many_subjects")
    named = await gateway.post(path, json={"keys": ["k.1", "k.1099"]})
    assert named.status_code == 200 and len(named.json()["entries"]) == 2, named.text


async def test_bad_reads(gateway: httpx.AsyncClient, name: str) -> None:
    assert (await gateway.put(f"/v1/kv/{name}", json={})).status_code == 201
    path = f"/v1/kv/{name}/read"
    for body in (
        {"keys": []},
        {"keys": ["a b"]},
        {"keys": ["a.>.b"]},
        {"keys": ["a\n"]},
        {"keys": ["a"], "at_revision": 0},
        {"keys": ["a"], "at_time": "soon"},
        {"keys": ["a"], "at_revision": 1, "at_time": "2024-01-01T00:00:00Z"},
        {"keys": "a"},
        {"keys": ["a"], "extra": 1},
    ):
        problem(await gateway.post(path, json=body), 400)
    problem(
        await gateway.post("/v1/kv/NOPE_NO_BUCKET/read", json={"keys": ["a"]}),
        404,
        "kv.bucket_not_found",
    )
    problem(await gateway.post("/v1/kv/bad.name/read", json={"keys": ["a"]}), 400)
