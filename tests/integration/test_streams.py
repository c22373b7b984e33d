"""Streams API against a real nats-server."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats

from app.metrics import Metrics
from app.nats.direct import DirectGet
from app.nats.embedded import EmbeddedServer
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.streams.service import StreamService
from tests.helpers import gateway_settings, problem


async def make_stream(gw: httpx.AsyncClient, name: str, **config: object) -> dict:
    body = {"subjects": [f"{name.lower()}.>"], **config}
    response = await gw.put(f"/v1/streams/{name}", json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_update_info_delete(gateway: httpx.AsyncClient, name: str) -> None:
    created = await make_stream(gateway, name, max_age="1h30m", duplicate_window=90)
    assert created["config"]["max_age"] == 5400
    assert created["config"]["duplicate_window"] == 90
    assert created["state"]["messages"] == 0

    updated = await gateway.put(
        f"/v1/streams/{name}",
        json={"subjects": [f"{name.lower()}.>"], "max_age": 60, "description": "orders"},
    )
    assert updated.status_code == 200
    assert updated.json()["config"]["max_age"] == 60
    assert updated.json()["config"]["description"] == "orders"

    info = await gateway.get(f"/v1/streams/{name}")
    assert info.status_code == 200
    assert info.json()["config"]["name"] == name

    assert (await gateway.delete(f"/v1/streams/{name}")).status_code == 204
    problem(await gateway.get(f"/v1/streams/{name}"), 404, "stream.not_found")
    problem(await gateway.delete(f"/v1/streams/{name}"), 404, "stream.not_found")


async def test_config_reaches_nats_in_nanoseconds(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(
        gateway,
        name,
        max_age="2m",
        consumer_limits={"inactive_threshold": "1.5s"},
        allow_direct=True,
    )
    info = await nc.jetstream().stream_info(name)
    assert info.config.max_age == 120.0  # nats-py reports seconds, from 120e9 ns on the wire
    assert info.config.allow_direct is True
    raw = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"")
    assert b'"inactive_threshold":1500000000' in raw.data


async def test_sources_from_start_times_beyond_the_servers_clock(
    gateway: httpx.AsyncClient, name: str
) -> None:
    """A source from a start time after 2262 or before 1678 (what the server's int64
    nanoseconds hold) wrapped around: 2999 copied every message, 1500 none. Each is sent as
    the nearest end of what the server holds."""
    await make_stream(gateway, name)
    for _ in range(3):
        published = await gateway.post(f"/v1/publish/{name.lower()}.a", content=b"x")
        assert published.status_code == 200, published.text
    copies = ("2999-01-01T00:00:00Z", "1500-01-01T00:00:00Z")
    for start in copies:
        source = {"name": name, "opt_start_time": start}
        made = await gateway.put(f"/v1/streams/{name}_{start[:4]}", json={"sources": [source]})
        assert made.status_code == 201, made.text
    async with asyncio.timeout(10):
        while True:
            held = {
                start: (await gateway.get(f"/v1/streams/{name}_{start[:4]}")).json()["state"]
                for start in copies
            }
            if held["1500-01-01T00:00:00Z"]["messages"] == 3:
                break
            await asyncio.sleep(0.05)
    # The source from 2999 is read to its end too: nothing from it is on its way.
    assert held["2999-01-01T00:00:00Z"]["messages"] == 0, held


async def test_list_filters_by_subject_and_pages(gateway: httpx.AsyncClient, name: str) -> None:
    names = [f"{name}_{i}" for i in range(3)]
    for n in names:
        await make_stream(gateway, n)
    listing = await gateway.get("/v1/streams", params={"subject": f"{names[1].lower()}.x"})
    assert listing.status_code == 200
    assert [s["name"] for s in listing.json()["streams"]] == [names[1]]
    summary = listing.json()["streams"][0]
    assert set(summary) >= {
        "name",
        "subjects",
        "messages",
        "bytes",
        "first_seq",
        "last_seq",
        "consumer_count",
    }
    everything = (await gateway.get("/v1/streams", params={"limit": 1000})).json()
    assert set(names) <= {s["name"] for s in everything["streams"]}
    page = (await gateway.get("/v1/streams", params={"limit": 1, "offset": 1})).json()
    assert len(page["streams"]) == 1 and page["offset"] == 1


async def test_what_an_update_cannot_change_is_a_conflict(
    gateway: httpx.AsyncClient, name: str
) -> None:
    """nats-server refuses these changes with a plain 400 (configUpdateCheck); the request is
    well formed and the stream is there, so each is 409 stream.not_updatable, and the stream
    is left as it was."""
    subjects = [f"{name.lower()}.>"]
    made = await make_stream(gateway, name, deny_delete=True, allow_msg_schedules=True)
    url = f"/v1/streams/{name}"
    for change in (
        {"storage": "memory"},
        {"retention": "workqueue"},
        {"allow_msg_counter": True},
        {"persist_mode": "async"},
        {"deny_delete": False},
        {"allow_msg_schedules": False},
    ):
        body = {"subjects": subjects, "deny_delete": True, "allow_msg_schedules": True, **change}
        refused = problem(await gateway.put(url, json=body), 409, "stream.not_updatable")
        assert next(iter(change)) in refused["detail"], (change, refused)
    assert (await gateway.get(url)).json()["config"] == made["config"]
    # Limits and interest change into each other; workqueue is left only by a new stream.
    interest = {"subjects": subjects, "deny_delete": True, "allow_msg_schedules": True}
    changed = await gateway.put(url, json={**interest, "retention": "interest"})
    assert changed.status_code == 200, changed.text
    queue = f"{name}_q"
    await make_stream(gateway, queue, subjects=[f"{queue.lower()}.>"], retention="workqueue")
    back = {"subjects": [f"{queue.lower()}.>"], "retention": "limits"}
    problem(await gateway.put(f"/v1/streams/{queue}", json=back), 409, "stream.not_updatable")


async def test_purge_variants(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name)
    subject = name.lower()
    for i in range(6):
        await gateway.post(f"/v1/publish/{subject}.{'a' if i % 2 else 'b'}", content=b"x")
    purged = await gateway.post(f"/v1/streams/{name}/purge", json={"filter": f"{subject}.a"})
    assert purged.json() == {"purged": 3}
    purged = await gateway.post(f"/v1/streams/{name}/purge", json={"keep": 1})
    assert purged.json() == {"purged": 2}
    purged = await gateway.post(f"/v1/streams/{name}/purge")
    assert purged.json() == {"purged": 1}
    problem(
        await gateway.post(f"/v1/streams/{name}/purge", json={"seq": 3, "keep": 1}),
        400,
        "request.invalid",
    )
    problem(
        await gateway.post(f"/v1/streams/{name}/purge", json={"filter": "a b"}),
        400,
        "request.invalid",
    )


async def test_what_the_config_denies_is_a_conflict(gateway: httpx.AsyncClient, name: str) -> None:
    """A purge of a stream with deny_purge and a delete from one with deny_delete: 409
    stream.operation_denied, nothing removed (nats-server answers both with codes that stand
    for any failure of the operation)."""
    subject = name.lower()
    config = {"subjects": [f"{subject}.>"], "deny_purge": True, "deny_delete": True}
    assert (await gateway.put(f"/v1/streams/{name}", json=config)).status_code == 201
    await gateway.post(f"/v1/publish/{subject}.a", content=b"x")
    problem(await gateway.post(f"/v1/streams/{name}/purge"), 409, "stream.operation_denied")
    problem(await gateway.delete(f"/v1/streams/{name}/messages/1"), 409, "stream.operation_denied")
    assert (await gateway.get(f"/v1/streams/{name}")).json()["state"]["messages"] == 1


async def test_a_preferred_server_in_a_placement_is_refused_before_nats(
    gateway: httpx.AsyncClient, name: str
) -> None:
    """nats-server refuses a ``preferred`` server in a stream's placement on every release (it
    names a leader in a step-down only): the gateway's schema has no such field, so the
    request is 400 ``request.invalid`` and nothing is made (the contract fuzzer found the
    server's refusal behind a schema that allowed it)."""
    body = {"subjects": [f"{name.lower()}.>"], "placement": {"preferred": "n1"}}
    problem(await gateway.put(f"/v1/streams/{name}", json=body), 400, "request.invalid")
    problem(
        await gateway.put(f"/v1/kv/{name}", json={"placement": {"preferred": "n1"}}),
        400,
        "request.invalid",
    )
    assert (await gateway.get(f"/v1/streams/{name}")).status_code == 404


async def test_message_get_and_delete(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.one"
    ack = await gateway.post(
        f"/v1/publish/{subject}", content=b"\x00\x01bin", headers={"Nats-Header-Trace": "t1"}
    )
    seq = ack.json()["seq"]
    message = (await gateway.get(f"/v1/streams/{name}/messages/{seq}")).json()
    assert message["subject"] == subject
    assert base64.b64decode(message["data"]) == b"\x00\x01bin"
    assert message["headers"]["Trace"] == ["t1"]
    assert message["time"].endswith("Z")
    assert (
        await gateway.delete(f"/v1/streams/{name}/messages/{seq}?erase=true")
    ).status_code == 204
    problem(await gateway.get(f"/v1/streams/{name}/messages/{seq}"), 404, "message.not_found")
    problem(await gateway.get(f"/v1/streams/{name}/messages/0"), 400)
    problem(await gateway.get(f"/v1/streams/{name}/messages/-1"), 400)
    problem(await gateway.get(f"/v1/streams/{name}/messages/abc"), 400)


async def test_bad_stream_input(gateway: httpx.AsyncClient, name: str) -> None:
    for bad in ["a.b", "a b", "a*", ">", "x" * 256, "a%0A"]:
        problem(await gateway.get(f"/v1/streams/{bad}"), 400, "stream.name_invalid")
    problem(await gateway.put(f"/v1/streams/{name}", json={"subjects": ["a"], "nope": 1}), 400)
    problem(
        await gateway.put(
            f"/v1/streams/{name}",
            content=b"{not json",
            headers={"content-type": "application/json"},
        ),
        400,
    )
    problem(await gateway.put(f"/v1/streams/{name}", json={"subjects": ["a b"]}), 400)
    problem(await gateway.put(f"/v1/streams/{name}", json={"subjects": ["a.>.b"]}), 400)
    problem(await gateway.put(f"/v1/streams/{name}", json={"max_age": "soon"}), 400)
    problem(await gateway.put(f"/v1/streams/{name}", json={"max_age": -1}), 400)
    problem(await gateway.put(f"/v1/streams/{name}", json={"retention": "forever"}), 400)
    problem(
        await gateway.put(f"/v1/streams/{name}", json={"name": "other"}),
        400,
        "stream.name_mismatch",
    )
    problem(await gateway.put(f"/v1/streams/{name}", json=["subjects"]), 400)
    # Nothing was created by any of these.
    problem(await gateway.get(f"/v1/streams/{name}"), 404, "stream.not_found")


async def test_subject_overlap_is_conflict(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name)
    response = await gateway.put(f"/v1/streams/{name}X", json={"subjects": [f"{name.lower()}.a"]})
    body = problem(response, 409, "stream.subject_overlap")
    assert body["nats"]["err_code"] == 10065


class CountingApi(JetStreamApi):
    """The JetStream API over a real connection, counting its requests by operation (and
    the most in flight at once)."""

    def __init__(self, pool: NatsPool) -> None:
        super().__init__(pool)
        self.calls: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    async def call(self, operation: str, *tokens: str, **options: Any) -> dict[str, Any]:
        self.calls[operation] += 1
        self.in_flight[operation] += 1
        self.most[operation] = max(self.most[operation], self.in_flight[operation])
        try:
            return await super().call(operation, *tokens, **options)
        finally:
            self.in_flight[operation] -= 1


@asynccontextmanager
async def counted_api(url: str) -> AsyncIterator[CountingApi]:
    pool = NatsPool(gateway_settings(url), [url], Metrics())
    await pool.start(wait=10)
    try:
        yield CountingApi(pool)
    finally:
        await pool.close()


async def test_the_streams_of_many_subjects_are_asked_a_few_at_a_time(
    gateway: httpx.AsyncClient, nats_server: EmbeddedServer, name: str
) -> None:
    """One atomic batch may have 1,000 subjects: not 1,000 STREAM.NAMES requests at once."""
    await make_stream(gateway, name)
    subjects = [f"{name.lower()}.{i}" for i in range(100)] + [f"{name}.nowhere"]
    async with counted_api(nats_server.url) as js:
        streams = StreamService(js, DirectGet(js))
        found = await streams.capturing_all(subjects)
        assert found == {**dict.fromkeys(subjects[:-1], name), subjects[-1]: None}
        assert js.calls["stream.names"] == 101
        assert 1 < js.most["stream.names"] <= 16
