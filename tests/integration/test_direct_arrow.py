"""Batch Direct Get answered as an Arrow IPC stream (content negotiation), against NDJSON."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import httpx
import nats
import pyarrow as pa
import pytest

import app.direct.arrow
from tests.helpers import problem

pytestmark = pytest.mark.server("2.11")  # batched Direct Get

ARROW = "application/vnd.apache.arrow.stream"


def arrow_answer(response: httpx.Response) -> tuple[list[dict], dict[bytes, bytes]]:
    """Rows and the end-of-batch metadata of an Arrow answer."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    reader = pa.ipc.open_stream(response.content)
    assert reader.schema.metadata == {b"jsgw.format": b"direct-batch/1"}
    rows, marker = [], {}
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        assert not marker, "a batch after the end-of-batch marker"
        if metadata is not None:
            assert batch.num_rows == 0
            marker = dict(metadata)
        # Times as integer nanoseconds, to compare them exactly.
        index = batch.schema.get_field_index("time")
        batch = batch.set_column(index, "time", batch.column(index).cast(pa.int64()))
        rows += batch.to_pylist()
    return rows, marker


def rfc3339_ns(text: str) -> int:
    whole, _, fraction = text.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    return int(seconds) * 10**9 + int((fraction or "0").ljust(9, "0"))


async def make_stream(gw: httpx.AsyncClient, name: str) -> None:
    body = {"subjects": [f"{name}.>"], "allow_direct": True}
    assert (await gw.put(f"/v1/streams/{name}", json=body)).status_code == 201


async def test_arrow_batch_carries_what_ndjson_carries(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    js = nc.jetstream()
    for i in range(2500):  # more than one server page and more than one record batch
        headers = {"Trace": f"t{i}"} if i % 2 else None
        await js.publish(f"{name}.{i % 3}", bytes([i % 256]) * (i % 50), headers=headers)

    params = {"seq": 7, "batch": 2200}
    ndjson = await gateway.get(f"/v1/streams/{name}/direct", params=params)
    lines = [json.loads(line) for line in ndjson.text.splitlines()]
    rows, marker = arrow_answer(
        await gateway.get(f"/v1/streams/{name}/direct", params=params, headers={"Accept": ARROW})
    )
    assert len(rows) == len(lines) - 1 == 2200
    eob = lines[-1]
    assert marker == {
        b"jsgw": b"eob",
        b"num_pending": str(eob["num_pending"]).encode(),
        b"last_seq": str(eob["last_seq"]).encode(),
    }
    for row, line in zip(rows, lines, strict=False):
        assert (row["stream"], row["subject"], row["seq"]) == (
            line["stream"],
            line["subject"],
            line["seq"],
        )
        assert row["data"] == base64.b64decode(line["data"])
        assert dict(row["headers"] or []) == line["headers"]
        assert row["time"] == rfc3339_ns(line["time"])

    only = await gateway.get(
        f"/v1/streams/{name}/direct",
        headers={"Accept": ARROW},
        params={"seq": 1, "batch": 5, "next_by_subj": f"{name}.2"},
    )
    rows, marker = arrow_answer(only)
    assert [r["seq"] for r in rows] == [3, 6, 9, 12, 15] and marker[b"jsgw"] == b"eob"


async def test_arrow_batch_of_nothing_is_just_the_marker(
    gateway: httpx.AsyncClient, name: str
) -> None:
    await make_stream(gateway, name)
    answer = await gateway.get(
        f"/v1/streams/{name}/direct", params={"seq": 1, "batch": 10}, headers={"Accept": ARROW}
    )
    rows, marker = arrow_answer(answer)
    assert rows == [] and marker == {b"jsgw": b"eob", b"num_pending": b"0", b"last_seq": b"0"}


async def test_without_pyarrow_arrow_only_is_406_and_ndjson_is_the_fallback(
    gateway: httpx.AsyncClient, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_stream(gateway, name)
    assert (await gateway.post(f"/v1/publish/{name}.a", content=b"x")).status_code == 200
    monkeypatch.setattr(app.direct.arrow, "pa", None)  # an install without the optional pyarrow
    params = {"seq": 1, "batch": 10}
    refused = await gateway.get(
        f"/v1/streams/{name}/direct", params=params, headers={"Accept": ARROW}
    )
    problem(refused, 406, "direct.arrow_unavailable")
    fallback = await gateway.get(
        f"/v1/streams/{name}/direct",
        params=params,
        headers={"Accept": f"{ARROW}, application/x-ndjson;q=0.5"},
    )
    assert fallback.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(x).get("seq") for x in fallback.text.splitlines()] == [1, None]
