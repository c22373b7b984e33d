"""Counters (ADR-49): increments, reads, multi reads and sourced counters, on nats-server 2.12+."""

from __future__ import annotations

import asyncio

import httpx
import nats
import pytest

from app.counters.service import CounterService, floor_key
from app.direct.service import DirectService
from app.metrics import Metrics
from app.nats.direct import DirectGet
from app.nats.embedded import EmbeddedServer
from app.publish.service import Publisher
from app.streams.service import StreamService
from tests.helpers import problem
from tests.integration.test_streams import counted_api, make_stream

BIG = "123456789012345678901234567890123456789"  # past 2^128: no integer type holds it


@pytest.mark.server("2.12")
async def test_increments_and_reads(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_stream(gateway, name, allow_msg_counter=True, allow_direct=True)
    low = name.lower()
    base = f"/v1/counters/{name}"

    first = await gateway.post(f"{base}/{low}.hits", json={"increment": "5"})
    assert first.json() == {"stream": name, "subject": f"{low}.hits", "seq": 1, "value": "5"}
    assert (await gateway.post(f"{base}/{low}.hits", json={"increment": 8})).json()["value"] == "13"
    assert (await gateway.post(f"{base}/{low}.hits", json={"increment": "-20"})).json()[
        "value"
    ] == "-7"
    # A JSON integer past 64 bits stays exact (no float on the way), and so does the sum.
    big = await gateway.post(f"{base}/{low}.big", content=b'{"increment": %s}' % BIG.encode())
    assert big.json()["value"] == BIG
    again = await gateway.post(f"{base}/{low}.big", json={"increment": "+" + BIG})
    assert again.json()["value"] == str(2 * int(BIG))
    # What the server stored is what nats-py reads: the counter's value as a string.
    msg = await nc.jetstream().get_last_msg(name, f"{low}.hits")
    assert msg.data == b'{"val":"-7"}'

    got = await gateway.get(f"{base}/{low}.hits")
    assert got.json() == {"stream": name, "subject": f"{low}.hits", "seq": 3, "value": "-7"}
    problem(await gateway.get(f"{base}/{low}.never"), 404, "counter.not_found")

    read = await gateway.post(f"{base}/read", json={"subjects": [f"{low}.>"]})
    assert read.json() == {
        "up_to_seq": 5,
        "counters": [
            {"subject": f"{low}.hits", "seq": 3, "value": "-7"},
            {"subject": f"{low}.big", "seq": 5, "value": str(2 * int(BIG))},
        ],
    }
    # One point in time: as of seq 4, big had its first value.
    earlier = await gateway.post(f"{base}/read", json={"subjects": [f"{low}.>"], "up_to_seq": 4})
    assert earlier.json()["counters"][-1] == {"subject": f"{low}.big", "seq": 4, "value": BIG}

    # Bad increments: refused before anything is sent.
    for body in (
        {"increment": "abc"},
        {"increment": 1.5},
        {"increment": "1.5"},
        {"increment": "+"},
        {"increment": "1e3"},
        {"increment": " 5"},
        {"increment": "5\n"},
        {"increment": "9" * 101},
        {"increment": True},
        {"increment": None},
        {"increment": ["5"]},
    ):
        problem(
            await gateway.post(f"{base}/{low}.hits", json=body), 400, "counter.increment_invalid"
        )
    for raw in (
        b'{"increment": ' + b"9" * 5000 + b"}",
        b'{"increment": NaN}',
        b'{"increment": 1E2}',
    ):
        problem(
            await gateway.post(f"{base}/{low}.hits", content=raw), 400, "counter.increment_invalid"
        )
    problem(await gateway.post(f"{base}/{low}.hits", json={}), 400, "request.invalid")
    problem(await gateway.post(f"{base}/{low}.hits", json={"increment": 1, "x": 1}), 400)
    problem(await gateway.post(f"{base}/{low}.hits", content=b"{"), 400, "request.invalid")
    assert (await gateway.get(f"{base}/{low}.hits")).json()["seq"] == 3

    # A subject the stream does not capture is not sent (it would count in another stream).
    problem(
        await gateway.post(f"{base}/elsewhere.x", json={"increment": 1}),
        409,
        "counter.wrong_stream",
    )
    # ... nor is one another stream captures, which is not named (the token may not know it).
    await make_stream(gateway, f"{name}X", allow_msg_counter=True)
    body = problem(
        await gateway.post(f"{base}/{low}x.a", json={"increment": 1}),
        409,
        "counter.wrong_stream",
    )
    assert f"{name}X" not in body["detail"] and "another stream stores it" in body["detail"]
    problem(
        await gateway.post("/v1/counters/NO_SUCH/x.y", json={"increment": 1}),
        404,
        "stream.not_found",
    )
    # A plain publish to a counting stream is told where increments go.
    problem(
        await gateway.post(f"/v1/publish/{low}.hits", content=b"1"),
        409,
        "counter.increment_required",
    )


@pytest.mark.server("2.12")
async def test_a_stream_that_does_not_count(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name)  # no allow_msg_counter, no allow_direct
    low = name.lower()
    problem(
        await gateway.post(f"/v1/counters/{name}/{low}.a", json={"increment": "1"}),
        409,
        "counter.not_allowed",
    )
    assert (await gateway.post(f"/v1/publish/{low}.a", content=b"plain")).status_code == 200
    # Read through the leader's STREAM.MSG.GET (no Direct Get): not a counter's message.
    problem(await gateway.get(f"/v1/counters/{name}/{low}.a"), 409, "counter.not_allowed")
    problem(await gateway.get(f"/v1/counters/{name}/{low}.b"), 404, "counter.not_found")


@pytest.mark.server("2.12")
async def test_a_stream_that_sources_two_counters(gateway: httpx.AsyncClient, name: str) -> None:
    low = name.lower()
    for region in ("EU", "US"):
        await gateway.put(
            f"/v1/streams/{name}_{region}",
            json={"subjects": [f"{low}.{region.lower()}.>"], "allow_msg_counter": True},
        )
    await gateway.put(
        f"/v1/streams/{name}",
        json={
            "allow_msg_counter": True,
            "allow_direct": True,
            "sources": [
                {
                    "name": f"{name}_{region}",
                    "subject_transforms": [
                        {"src": f"{low}.{region.lower()}.>", "dest": f"{low}.all.>"}
                    ],
                }
                for region in ("EU", "US")
            ],
        },
    )
    await gateway.post(f"/v1/counters/{name}_EU/{low}.eu.hits", json={"increment": 3})
    await gateway.post(f"/v1/counters/{name}_US/{low}.us.hits", json={"increment": "4"})
    for _ in range(100):
        got = await gateway.get(f"/v1/counters/{name}/{low}.all.hits")
        if got.status_code == 200 and got.json()["value"] == "7":
            break
        await asyncio.sleep(0.05)
    assert got.json()["value"] == "7", got.text
    assert got.json()["sources"] == {
        f"{name}_EU": {f"{low}.eu.hits": "3"},
        f"{name}_US": {f"{low}.us.hits": "4"},
    }


@pytest.mark.server("2.12")
async def test_a_read_behind_the_counters_floor_is_read_from_the_leader(
    gateway: httpx.AsyncClient, nats_server: EmbeddedServer, name: str
) -> None:
    """Read-your-writes (app.nats.floors): an increment raises the counter's floor to its
    sequence, and a Direct Get answered below the floor (a replica or mirror behind, made
    here by raising the floor past what the one server holds) is read again from the stream
    leader (STREAM.MSG.GET), whose answer stands."""
    await make_stream(gateway, name, allow_msg_counter=True, allow_direct=True)
    subject = f"{name.lower()}.hits"
    key = floor_key(name, subject)
    async with counted_api(nats_server.url) as js:
        direct = DirectGet(js)
        streams = StreamService(js, direct)
        publisher = Publisher(js.pool, js, Metrics())
        counters = CounterService(js, direct, DirectService(direct, js), streams, publisher)

        assert (await counters.increment(name, subject, "5"))["seq"] == 1
        assert (await counters.increment(name, subject, "2"))["seq"] == 2
        assert counters.floors.revisions[key] == 2
        got = await counters.get(name, subject)
        assert (got["seq"], got["value"]) == (2, "7")
        assert js.calls["stream.msg_get"] == 0  # at the floor: Direct Get's answer stands

        counters.floors.advance(key, 9)  # as if seq 9 had been acknowledged elsewhere
        got = await counters.get(name, subject)
        assert (got["seq"], got["value"]) == (2, "7")
        assert js.calls["stream.msg_get"] == 1  # below the floor: asked of the leader
        assert counters.floors.revisions[key] == 2  # ... whose answer is the floor now
        await counters.get(name, subject)
        assert js.calls["stream.msg_get"] == 1
