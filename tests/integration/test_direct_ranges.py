"""Sequence ranges of any stream (``GET /v1/streams/{s}/messages``), read through an ordered
consumer: the same answer as a batch Direct Get, bounded while the client does not read, and
the consumer gone after every read."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time

import httpx
import nats
import orjson
import pyarrow as pa
import pytest

from tests.helpers import problem

ARROW = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"


def ndjson(response: httpx.Response) -> tuple[list[dict], dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(NDJSON)
    lines = [orjson.loads(line) for line in response.content.splitlines()]
    assert lines and lines[-1].get("eob") is True, lines[-1:]
    return lines[:-1], lines[-1]


def arrow_rows(response: httpx.Response) -> tuple[list[dict], dict[bytes, bytes]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    reader = pa.ipc.open_stream(response.content)
    rows, marker = [], {}
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return rows, marker
        if metadata is not None:
            marker = dict(metadata)
        rows += batch.to_pylist()


async def consumer_count(nc: nats.NATS, stream: str, *, settle: float = 5.0) -> int:
    """The stream's consumers, once none is left or ``settle`` seconds have passed."""
    js = nc.jetstream()
    deadline = time.monotonic() + settle
    while True:
        count = (await js.stream_info(stream)).state.consumer_count
        if count == 0 or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.05)


@pytest.mark.server("2.11")  # (batched Direct Get)
async def test_a_range_of_a_stream_without_direct_get_reads_as_a_batch_would(
    url: str, nc: nats.NATS, name: str
) -> None:
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])  # allow_direct: false
    sent = []
    for i in range(2100):
        subject = f"{name}.{'ab'[i % 2]}.{i % 5}"
        headers = {"Trace": f"t{i}"} if i % 7 == 0 else None
        data = os.urandom(i % 200)
        sent.append((subject, data, headers))
    acks = []
    for start in range(0, len(sent), 500):
        acks += await asyncio.gather(
            *(js.publish(s, d, headers=h) for s, d, h in sent[start : start + 500])
        )
    assert [a.seq for a in acks] == list(range(1, 2101))
    await js.delete_msg(name, 1000)
    base = f"/v1/streams/{name}/messages"

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        rows, eob = ndjson(await http.get(base, params={"start_seq": 2, "end_seq": 2050}))
        assert [r["seq"] for r in rows] == [s for s in range(2, 2051) if s != 1000]
        assert eob == {"eob": True, "num_pending": 0, "last_seq": 2050}
        for row in rows[:50]:
            subject, data, headers = sent[row["seq"] - 1]
            assert (row["stream"], row["subject"]) == (name, subject)
            assert base64.b64decode(row["data"]) == data
            assert row["headers"] == ({k: [v] for k, v in headers.items()} if headers else {})
        as_arrow, marker = arrow_rows(
            await http.get(
                base, params={"start_seq": 2, "end_seq": 2050}, headers={"Accept": ARROW}
            )
        )
        assert [r["seq"] for r in as_arrow] == [r["seq"] for r in rows]
        assert marker[b"jsgw"] == b"eob" and marker[b"last_seq"] == b"2050"
        assert [r["data"] for r in as_arrow[:300]] == [sent[r["seq"] - 1][1] for r in rows[:300]]

        # Filters, a literal and a wildcard; the default end is the stream's last sequence.
        rows, eob = ndjson(
            await http.get(base, params={"subject": f"{name}.b.*", "start_seq": 1990})
        )
        assert [r["seq"] for r in rows] == list(range(1990, 2101, 2))
        assert eob["last_seq"] == 2100
        rows, _ = ndjson(await http.get(base, params={"subject": f"{name}.a.3", "end_seq": 60}))
        assert [r["seq"] for r in rows] == [s for s in range(1, 61) if (s - 1) % 10 == 8]
        # Nothing to read: past the end, an inverted range, a filter outside the stream.
        for params in (
            {"start_seq": 5000},
            {"start_seq": 10, "end_seq": 9},
            {"subject": "elsewhere.>"},
        ):
            rows, eob = ndjson(await http.get(base, params=params))
            assert rows == [] and eob["num_pending"] == 0, params

        # With allow_direct on, a batch Direct Get of the range answers the very same rows.
        info = (await http.get(f"/v1/streams/{name}")).json()
        config = {**info["config"], "allow_direct": True}
        assert (await http.put(f"/v1/streams/{name}", json=config)).status_code == 200
        direct, _ = ndjson(
            await http.get(f"/v1/streams/{name}/direct", params={"seq": 1900, "batch": 150})
        )
        ranged, _ = ndjson(await http.get(base, params={"start_seq": 1900, "end_seq": 2049}))
        assert ranged == direct

        # Bad input is refused before anything is read.
        problem(await http.get(base, params={"subject": f"{name}..x"}), 400)
        problem(await http.get(base, params={"start_seq": 0}), 400)
        problem(await http.get(base, params={"end_seq": "1e3"}), 400)
        problem(await http.get("/v1/streams/NOPE/messages"), 404, "stream.not_found")

    assert await consumer_count(nc, name) == 0


async def test_a_client_that_stops_reading_holds_back_the_consumer_and_one_that_leaves_ends_it(
    url: str, nc: nats.NATS, name: str
) -> None:
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    payload = os.urandom(8192)
    count = 7000  # 57 MB
    for _ in range(0, count, 1000):
        await asyncio.gather(*(js.publish(f"{name}.x", payload) for _i in range(1000)))
    host, port = url.removeprefix("http://").split(":")
    request = f"GET /v1/streams/{name}/messages HTTP/1.1\r\nHost: gw\r\nAccept: {ARROW}\r\n\r\n"

    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(request.encode())
        sock.recv(65536)  # the head and the first bytes, then nothing more for a while
        await asyncio.sleep(1.5)
        consumers = await js.consumers_info(name)
        assert len(consumers) == 1
        sent = consumers[0].delivered.stream_seq
        await asyncio.sleep(0.5)
        # The server stopped at its flow-control window: it waits for the answers.
        assert (await js.consumers_info(name))[0].delivered.stream_seq == sent
        # At most one flow-control window (32 MiB) past what the socket and the encoder hold.
        assert sent * len(payload) < 44 * 1024 * 1024, sent
        # Read it all now: the rest arrives.
        received = 0
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + 30
        while received < count * len(payload) and time.monotonic() < deadline:
            chunk = await loop.sock_recv(sock, 1 << 20)
            if not chunk:
                break
            received += len(chunk)
        assert received >= count * len(payload)
    assert await consumer_count(nc, name) == 0

    # A client that goes away in the middle: the consumer goes with it.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        sock.recv(65536)
        await asyncio.sleep(0.3)
        assert len(await js.consumers_info(name)) == 1
    assert await consumer_count(nc, name) == 0


@pytest.mark.server("2.11")  # (batched Direct Get)
async def test_a_republished_message_reads_alike_and_a_work_queue_is_refused(
    url: str, nc: nats.NATS, name: str
) -> None:
    """A message republished from another stream carries Nats-Stream, Nats-Sequence... of its
    own: both read paths leave them out (the reply's own fields say where a message is). A
    work queue cannot have a range read's consumer beside the one that takes its messages."""
    js = nc.jetstream()
    source = f"{name}SRC"
    await js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=True)
    await js.add_stream(
        name=source,
        subjects=[f"{source}.>"],
        republish={"src": f"{source}.>", "dest": f"{name}.rp.>"},
    )
    await js.publish(f"{source}.x", b"rp", headers={"Own": "o"})
    async with asyncio.timeout(10):  # (republished by the server, unacknowledged)
        while (await js.stream_info(name)).state.messages < 1:
            await asyncio.sleep(0.05)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        direct, _ = ndjson(
            await http.get(f"/v1/streams/{name}/direct", params={"seq": 1, "batch": 9})
        )
        ranged, _ = ndjson(await http.get(f"/v1/streams/{name}/messages"))
        assert direct == ranged and direct[0]["headers"] == {"Own": ["o"]}, (direct, ranged)

        queue = f"{name}WQ"
        await js.add_stream(name=queue, subjects=[f"{queue}.>"], retention="workqueue")
        await js.publish(f"{queue}.x", b"job")
        problem(await http.get(f"/v1/streams/{queue}/messages"), 409, "stream.range_workqueue")
        assert (await js.stream_info(queue)).state.consumer_count == 0
