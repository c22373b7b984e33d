"""How a batch read pages, with the server's part played by a core-NATS responder on a stream's
Direct Get subject (a stream JetStream does not have), so that each page's replies are exactly
the ones scripted: the gateway asks for the next page where the last one ended, and a reply
lost in a later page ends a stream already under way, after the messages before it, with an
error line in NDJSON and the error marker in Arrow."""

from __future__ import annotations

import asyncio
import json

import httpx
import nats
import nats.errors
import orjson
import pyarrow as pa
import pytest
from nats.aio.msg import Msg

from app.nats import replies
from app.nats.replies import LeanClient, hpub

ARROW = "application/vnd.apache.arrow.stream"
STAMP = "2026-11-26T06:00:00.000000001Z"


def reply_block(name: str, seq: int, last: int, trace: str | None = None) -> bytes:
    """A batch reply's header block as nats-server writes it (the message's own first)."""
    own = f"Trace: {trace}\r\n" if trace else ""
    return (
        f"NATS/1.0\r\n{own}Nats-Stream: {name}\r\nNats-Subject: {name}.s\r\n"
        f"Nats-Sequence: {seq}\r\nNats-Time-Stamp: {STAMP}\r\n"
        f"Nats-Num-Pending: {5 - seq}\r\nNats-Last-Sequence: {last}\r\n\r\n"
    ).encode()


EOB = b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 3\r\nNats-Last-Sequence: 2\r\n\r\n"


@pytest.mark.server("2.11")  # (2.10: no batch is sent)
async def test_a_reply_lost_in_a_later_page_ends_the_stream_after_what_came(
    gateway: httpx.AsyncClient, lean: LeanClient, name: str
) -> None:
    requests: list[dict] = []

    async def answer(msg: Msg) -> None:
        request = json.loads(msg.data)
        requests.append(request)
        if request["seq"] == 1:  # page 1: seqs 1 and 2 (1 with a header), 3 more pending
            replies = [(reply_block(name, 1, 0, "t1"), b"m1"), (reply_block(name, 2, 1), b"m2")]
            replies.append((EOB, b""))
        else:  # page 2: seq 3, then seq 5 saying it follows 4: 4 was lost
            replies = [(reply_block(name, 3, 2), b"m3"), (reply_block(name, 5, 4), b"m5")]
        commands = [hpub(msg.reply, "", head, data) for head, data in replies]
        assert lean.publish_all_queued(commands, sum(len(data) for _, data in replies))

    await lean.subscribe(f"$JS.API.DIRECT.GET.{name}", cb=answer)
    await lean.flush_in_order(5)
    params = {"seq": 1, "batch": 10}

    ndjson = await gateway.get(f"/v1/streams/{name}/direct", params=params)
    assert ndjson.status_code == 200, ndjson.text
    lines = [json.loads(line) for line in ndjson.text.splitlines()]
    assert [line.get("seq") for line in lines[:-1]] == [1, 2, 3]
    assert lines[0]["headers"] == {"Trace": ["t1"]} and lines[1]["headers"] == {}
    assert lines[2] == {
        "stream": name,
        "subject": f"{name}.s",
        "seq": 3,
        "time": STAMP,
        "headers": {},
        "data": "bTM=",
    }
    assert lines[-1]["error"]["code"] == "direct.gap"
    # The second page was asked for where the first ended, for what the read still wants.
    assert requests[:2] == [
        {"seq": 1, "batch": 10, "max_bytes": 4 * 1024 * 1024},
        {"seq": 3, "batch": 8, "max_bytes": 4 * 1024 * 1024},
    ]

    answer_arrow = await gateway.get(
        f"/v1/streams/{name}/direct", params=params, headers={"Accept": ARROW}
    )
    assert answer_arrow.status_code == 200
    reader = pa.ipc.open_stream(answer_arrow.content)
    rows: list[dict] = []
    marker: dict[bytes, bytes] = {}
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        rows += batch.select(["seq", "data"]).to_pylist()
        marker = dict(metadata or {})
    assert rows == [{"seq": 1, "data": b"m1"}, {"seq": 2, "data": b"m2"}, {"seq": 3, "data": b"m3"}]
    assert marker[b"jsgw"] == b"error"
    assert json.loads(marker[b"problem"])["code"] == "direct.gap"


@pytest.mark.server("2.11")  # (batched Direct Get)
async def test_a_page_read_goes_out_when_asking_for_the_next_fails(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next page is asked for before this one is sent: when that request cannot be sent
    (the connection closed under it; injected here), the page read goes out, then the error."""
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=True)
    for _ in range(3):
        await asyncio.gather(*(js.publish(f"{name}.x", b"m") for _ in range(1000)))
    send = replies.RawInbox.request
    calls = 0

    async def closed_at_the_second(self: replies.RawInbox, subject: str, payload: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise nats.errors.ConnectionClosedError
        await send(self, subject, payload)

    monkeypatch.setattr(replies.RawInbox, "request", closed_at_the_second)
    response = await gateway.get(f"/v1/streams/{name}/direct", params={"seq": 1, "batch": 3000})
    assert response.status_code == 200
    lines = [orjson.loads(line) for line in response.content.splitlines()]
    assert [line["seq"] for line in lines[:-1]] == list(range(1, 1001))
    assert lines[-1]["error"]["code"] == "nats.unavailable", lines[-1]
