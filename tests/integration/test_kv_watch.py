"""KV watches over SSE, through a real uvicorn (the in-process transport buffers responses)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import nats
import orjson
import pytest

from app.kv.model import entry_from_message
from app.kv.watch import _leader_next as watch_leader_next
from app.main import create_app
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway

# The watch has a lean path: the tests of the ``client`` fixture run through it and through
# FastAPI's route (tests/integration/conftest.py).
BOTH_PATHS = True


@dataclass
class Event:
    event: str = "message"
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    @property
    def json(self) -> dict:
        return json.loads(self.data)


class SSE:
    """A small reader of the text/event-stream format (WHATWG HTML 9.2.6)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self, timeout: float = 5.0, *, comments: bool = False) -> Event:
        """The next event (or, with ``comments``, the next comment-only block too)."""
        return await asyncio.wait_for(self._next(comments), timeout)

    async def _next(self, comments: bool) -> Event:
        event, data = Event(), []
        async for line in self._lines:
            if line == "":
                if data or event.id is not None or event.event != "message":
                    event.data = "\n".join(data)
                    return event
                if comments and event.comments:
                    return event
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "":
                event.comments.append(value)
            elif name == "event":
                event.event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event.id = value
        raise EOFError("the stream ended")

    async def until(self, kind: str, timeout: float = 5.0) -> list[Event]:
        """Events up to and including the first of ``kind``."""
        seen: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(deadline - time.monotonic(), 0.01))
            seen.append(event)
            if event.event == kind:
                return seen


@contextlib.asynccontextmanager
async def watching(
    client: httpx.AsyncClient, bucket: str, headers: dict[str, str] | None = None, **params: object
) -> AsyncIterator[SSE]:
    query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
    async with client.stream("GET", f"/v1/kv/{bucket}/watch", params=query, headers=headers) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        yield SSE(r)


async def consumer_count(nc: nats.NATS, bucket: str) -> int:
    reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", b"", timeout=2)
    return orjson.loads(reply.data)["state"]["consumer_count"]


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http


async def bucket(client: httpx.AsyncClient, name: str, **config: object) -> str:
    response = await client.put(f"/v1/kv/{name}", json=config)
    assert response.status_code == 201, response.text
    return name


async def put(client: httpx.AsyncClient, bucket: str, key: str, value: bytes) -> int:
    response = await client.put(f"/v1/kv/{bucket}/keys/{key}", content=value)
    assert response.status_code == 200, response.text
    return response.json()["revision"]


async def test_initial_values_then_ready_then_changes(client: httpx.AsyncClient, name: str) -> None:
    await bucket(client, name, history=5)
    await put(client, name, "a", b"1")  # 1
    await put(client, name, "a", b"2")  # 2
    await put(client, name, "b", b"x")  # 3
    await client.delete(f"/v1/kv/{name}/keys/b")  # 4
    async with watching(client, name) as sse:
        initial = await sse.until("ready")
        assert [(e.event, e.id) for e in initial] == [("put", "2"), ("delete", "4"), ("ready", "4")]
        a = initial[0].json
        assert a["key"] == "a" and base64.b64decode(a["value"]) == b"2" and a["revision"] == 2
        assert a["operation"] == "PUT" and a["bucket"] == name and a["created"].endswith("Z")
        assert initial[1].json["operation"] == "DEL"
        # The same timestamp as a read gives for that revision (consumer vs Direct Get).
        read = await client.get(f"/v1/kv/{name}/keys/a")
        assert a["created"] == read.headers["kv-created"]
        assert initial[2].json == {"revision": 4}
        await put(client, name, "c", b"new")
        change = await sse.next()
        assert (change.event, change.id, change.json["key"]) == ("put", "5", "c")
        assert change.json["delta"] == 0
        await client.delete(f"/v1/kv/{name}/keys/c", params={"purge": "true"})
        purge = await sse.next()
        assert (purge.event, purge.id, purge.json["operation"]) == ("purge", "6", "PURGE")


async def test_ready_comes_first_when_nothing_is_there(
    client: httpx.AsyncClient, name: str
) -> None:
    await bucket(client, name)
    async with watching(client, name) as sse:
        ready = await sse.next()
        assert ready.event == "ready"
        await put(client, name, "k", b"v")
        assert (await sse.next()).id == "1"
    await put(client, name, "k", b"w")  # 2
    async with watching(client, name, updates_only=True) as sse:
        ready = await sse.next()
        assert (ready.event, ready.id) == ("ready", "2")  # nothing current is sent
        await put(client, name, "k", b"x")
        change = await sse.next()
        assert (change.event, change.id) == ("put", "3")
    async with watching(client, name, key="other.>") as sse:
        assert (await sse.next()).event == "ready"  # a filter matching nothing


async def test_watch_options(client: httpx.AsyncClient, name: str) -> None:
    await bucket(client, name, history=10)
    await put(client, name, "a.1", b"one")  # 1
    await put(client, name, "a.1", b"two")  # 2
    await put(client, name, "a.2", b"x")  # 3
    await client.delete(f"/v1/kv/{name}/keys/a.2")  # 4
    await put(client, name, "b", b"y")  # 5
    async with watching(client, name, history=True) as sse:
        ids = [e.id for e in await sse.until("ready")]
        assert ids == ["1", "2", "3", "4", "5", "5"]
    async with watching(client, name, ignore_deletes=True) as sse:
        events = await sse.until("ready")
        assert [(e.event, e.id) for e in events] == [("put", "2"), ("put", "5"), ("ready", "5")]
    async with watching(client, name, meta_only=True, key="a.*") as sse:
        events = await sse.until("ready")
        assert [e.id for e in events] == ["2", "4", "4"]
        assert all("value" not in e.json for e in events[:-1])
        assert events[0].json["key"] == "a.1" and events[0].json["delta"] == 1
    # The catch-up ran on the stream's only server, which held revision 5: it is believed
    # (nothing in the filter up to 5 is asked of the leader again, as for a replica behind).
    exported = (await client.get("/metrics")).text
    assert 'jsgw_nats_request_duration_seconds_count{operation="kv.watch"}' not in exported
    async with watching(client, name, key="a.1", history=True) as sse:
        events = await sse.until("ready")
        assert [(e.id, e.json.get("delta")) for e in events[:-1]] == [("1", 1), ("2", 0)]
        await put(client, name, "b", b"not watched")
        await put(client, name, "a.1", b"three")
        assert (await sse.next()).id == "7"


async def test_resume_after_disconnect_sees_every_revision_once(
    client: httpx.AsyncClient, name: str
) -> None:
    await bucket(client, name)
    total = 80
    writes_done = asyncio.Event()

    async def writer() -> None:
        for i in range(total):
            await put(client, name, f"k.{i}", str(i).encode())
            await asyncio.sleep(0.005)
        writes_done.set()

    first: list[int] = []
    writing = asyncio.create_task(writer())
    async with watching(client, name) as sse:
        while len(first) < 20:
            event = await sse.next()
            if event.event in ("put", "ready"):
                first.append(int(event.id or 0))
    last_id = str(first[-1])  # what a browser sends back as Last-Event-ID
    first = [i for i in first if i]  # a ready on an empty bucket has id 0
    await asyncio.sleep(0.1)  # writes go on while nobody watches
    second: list[int] = []
    async with watching(client, name, headers={"Last-Event-ID": last_id}) as sse:
        await writes_done.wait()
        while True:
            event = await sse.next()
            if event.event == "put":
                second.append(int(event.id or 0))
            if second and second[-1] == total:
                break
    await writing
    assert not set(first) & set(second), "an event was repeated"
    assert sorted(set(first) | set(second)) == list(range(1, total + 1)), "an event was lost"
    assert second == sorted(second)
    async with watching(client, name, since=total - 3) as sse:
        assert [e.id for e in await sse.until("ready")] == [
            str(total - 2),
            str(total - 1),
            str(total),
            str(total),
        ]


async def test_deleting_the_bucket_ends_the_watch_with_an_error(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await bucket(client, name)
    await put(client, name, "k", b"v")
    async with watching(client, name) as sse:
        await sse.until("ready")
        assert (await client.delete(f"/v1/kv/{name}")).status_code == 204
        error = await sse.next()
        assert error.event == "error" and error.json["code"] == "kv.bucket_deleted"
        with pytest.raises(EOFError):
            await sse.next(comments=True)


async def settled_consumer_count(nc: nats.NATS, bucket: str, expected: int) -> int:
    """The consumer count once short-lived catch-up consumers are gone (at most 2 s)."""
    deadline = time.monotonic() + 2
    while (count := await consumer_count(nc, bucket)) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return count


async def test_disconnect_releases_the_consumer_at_once(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await bucket(client, name)
    async with watching(client, name) as sse:
        await sse.until("ready")
        assert await settled_consumer_count(nc, name, 1) == 1
        async with watching(client, name, key="x") as other:
            await other.until("ready")
            assert await settled_consumer_count(nc, name, 2) == 2
    started = time.monotonic()
    while await consumer_count(nc, name) and time.monotonic() - started < 5:
        await asyncio.sleep(0.02)
    assert await consumer_count(nc, name) == 0
    assert time.monotonic() - started < 1.0, "the consumer outlived its client"


async def test_watchers_of_the_same_keys_share_one_consumer(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Fan-out: one NATS consumer per (bucket, filter, meta_only), however many clients watch,
    whatever else they ask for; each still gets exactly its own events."""
    await bucket(client, name, history=10)
    for i in range(5):
        await put(client, name, f"k{i}", b"old")
    await client.delete(f"/v1/kv/{name}/keys/k4")  # revision 6
    kinds = [{}, {"history": True}, {"updates_only": True}, {"ignore_deletes": True}, {"since": 3}]
    async with contextlib.AsyncExitStack() as stack:
        watchers = []
        for i in range(20):
            options = kinds[i % len(kinds)]
            sse = await stack.enter_async_context(watching(client, name, **options))
            initial = await sse.until("ready")
            watchers.append((options, sse, initial))
        assert await settled_consumer_count(nc, name, 1) == 1
        meta = await stack.enter_async_context(watching(client, name, meta_only=True))
        await meta.until("ready")
        assert await settled_consumer_count(nc, name, 2) == 2
        await put(client, name, "k1", b"new")  # revision 7
        await client.delete(f"/v1/kv/{name}/keys/k0")  # revision 8
        await put(client, name, "k9", b"new")  # revision 9
        expected_initial = {
            "{}": ["1", "2", "3", "4", "6", "6"],
            "{'history': True}": ["1", "2", "3", "4", "5", "6", "6"],
            "{'updates_only': True}": ["6"],
            "{'ignore_deletes': True}": ["1", "2", "3", "4", "6"],
            "{'since': 3}": ["4", "5", "6", "6"],
        }
        for options, sse, initial in watchers:
            assert [e.id for e in initial] == expected_initial[str(options)], options
            wanted = ["7", "9"] if options.get("ignore_deletes") else ["7", "8", "9"]
            live = [await sse.next() for _ in wanted]
            assert [e.id for e in live] == wanted, options
            assert live[0].json["value"] == base64.b64encode(b"new").decode()
        assert [(await meta.next()).id for _ in range(3)] == ["7", "8", "9"]
    assert await settled_consumer_count(nc, name, 0) == 0


async def test_a_burst_reaches_readers_and_a_stalled_reader_in_order(
    url: str, client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Events go to a connection at once while it takes them and are queued for its writer
    when it does not (a client that stopped reading): either way every watcher gets every
    revision once, in order, and a stalled one catches up when it reads again. (The bucket
    keeps every revision of the burst: with ``history`` 1, a feed behind the stream by more
    than 7 puts would meet revisions already replaced, which the server skips.)"""
    await bucket(client, name, history=64)
    count, value = 300, b"v" * 16384  # ~6.6 MB of events: past what the sockets buffer
    # The stalled client: a receive buffer of a few KiB, and nothing read during the burst.
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    host, port = httpx.URL(url).host, httpx.URL(url).port
    await asyncio.get_running_loop().sock_connect(raw, (host, port))
    reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 22)
    writer.write(f"GET /v1/kv/{name}/watch HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    stalled = b""
    while b"event: ready" not in stalled:
        stalled += await asyncio.wait_for(reader.read(65536), 5)
    try:
        async with contextlib.AsyncExitStack() as stack:
            watchers = [await stack.enter_async_context(watching(client, name)) for _ in range(3)]
            for sse in watchers:
                await sse.until("ready")
            kv = await nc.jetstream().key_value(name)
            revisions = [await kv.put(f"k{i % 7}", value) for i in range(count)]

            async def read_all(sse: SSE) -> list[int]:
                return [int((await sse.next(10)).id or 0) for _ in range(count)]

            for got in await asyncio.gather(*(read_all(sse) for sse in watchers)):
                assert got == revisions
            last = f"id: {revisions[-1]}\r\n".encode()
            while last not in stalled:
                stalled += await asyncio.wait_for(reader.read(65536), 10)
            assert [int(i) for i in re.findall(rb"\nid: (\d+)\r\n", stalled)][1:] == revisions
    finally:
        writer.close()


async def test_many_watchers_connecting_at_once_stay_under_the_consumer_limit(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """Catch-up consumers are limited per worker: 300 clients connecting together on a bucket
    whose stream allows only 40 consumers all get their initial values and every change.
    (Anonymous, from one address, with the default stream caps.)"""
    settings = gateway_settings(nats_server.url)
    with served_gateway(settings) as served:
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(base_url=served, timeout=30, limits=limits) as http:
            await bucket(http, name)
            js = nc.jetstream()
            info = await js.stream_info(f"KV_{name}")
            info.config.max_consumers = 40
            # Made again rather than updated: before 2.12 the limit cannot change.
            await js.delete_stream(f"KV_{name}")
            await js.add_stream(info.config)
            await put(http, name, "a", b"1")

            async def one(stack: contextlib.AsyncExitStack) -> SSE:
                sse = await stack.enter_async_context(watching(http, name))
                assert [e.id for e in await sse.until("ready", timeout=20)] == ["1", "1"]
                return sse

            async with contextlib.AsyncExitStack() as stack:
                clients = await asyncio.gather(*(one(stack) for _ in range(300)))
                assert await settled_consumer_count(nc, name, 1) == 1
                revision = await put(http, name, "a", b"2")
                for sse in clients:
                    assert (await sse.next(timeout=10)).id == str(revision)


async def test_heartbeats_are_comments(client: httpx.AsyncClient, name: str) -> None:
    await bucket(client, name)
    async with watching(client, name) as sse:
        await sse.until("ready")
        ping = await sse.next(timeout=3, comments=True)
        assert ping.comments == ["ping"] and ping.data == ""


async def test_errors_come_before_the_stream(client: httpx.AsyncClient, name: str) -> None:
    await bucket(client, name)
    cases = [
        (f"/v1/kv/{name}X/watch", {}, 404, "kv.bucket_not_found"),
        ("/v1/kv/a.b/watch", {}, 400, "kv.bucket_invalid"),
        (f"/v1/kv/{name}/watch?key=a.>.b", {}, 400, "kv.key_filter_invalid"),
        (f"/v1/kv/{name}/watch?key=a%0A", {}, 400, "kv.key_filter_invalid"),
        (f"/v1/kv/{name}/watch?history=true&updates_only=true", {}, 400, "kv.watch_invalid"),
        (f"/v1/kv/{name}/watch", {"Last-Event-ID": "abc"}, 400, "kv.last_event_id_invalid"),
        (f"/v1/kv/{name}/watch?since=-1", {}, 400, "request.invalid"),
        (f"/v1/kv/{name}/watch?since={2**64 - 1}", {}, 400, "kv.watch_invalid"),
        (f"/v1/kv/{name}/watch", {"Last-Event-ID": str(2**64 - 1)}, 400, "kv.watch_invalid"),
    ]
    for path, headers, status, code in cases:
        response = await client.get(path, headers=headers)
        assert response.status_code == status, (path, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == code


async def test_too_many_watches(nats_server: EmbeddedServer, name: str) -> None:
    settings = gateway_settings(nats_server.url, kv_max_watches=1)
    with served_gateway(settings) as served:
        async with httpx.AsyncClient(base_url=served, timeout=10) as http:
            await bucket(http, name)
            async with watching(http, name) as sse:
                await sse.until("ready")
                refused = await http.get(f"/v1/kv/{name}/watch")
                assert refused.status_code == 429 and refused.headers["retry-after"]
                assert refused.json()["code"] == "kv.too_many_watches"
            # The slot is given back as soon as the server sees the first client go.
            for _ in range(100):
                async with http.stream("GET", f"/v1/kv/{name}/watch") as again:
                    if again.status_code == 200:
                        assert (await SSE(again).next()).event == "ready"
                        break
                    assert again.status_code == 429
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the watch slot was never given back")


@contextlib.asynccontextmanager
async def stalled_watch(
    served: str, nc: nats.NATS, name: str
) -> AsyncIterator[asyncio.StreamReader]:
    """A watch of bucket ``name`` (made here) by a client that reads nothing while 200 kB
    values are written: socket buffers fill, then the gateway's queue does, and the shared
    feed's consumer goes. Yields the client's side of the connection."""
    async with httpx.AsyncClient(base_url=served, timeout=10) as http:
        await bucket(http, name, history=64)
    host, port = served.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET /v1/kv/{name}/watch HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        assert b"200" in await reader.readline()
        assert await settled_consumer_count(nc, name, 1) == 1  # the shared feed
        value = b"v" * 200_000
        js = nc.jetstream()
        for i in range(150):
            await js.publish(f"$KV.{name}.k.{i}", value)
            if i > 60 and await consumer_count(nc, name) == 0:
                break
        assert await consumer_count(nc, name) == 0, "a stalled client still holds a consumer"
        yield reader
    finally:
        writer.close()


async def test_a_slow_client_is_cut_off_with_an_error(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """A client that stops reading: the queue stays bounded, NATS is released, an error ends it."""
    settings = gateway_settings(nats_server.url, sse_queue_size=4, kv_watch_heartbeat=0.5)
    with served_gateway(settings) as served:
        async with stalled_watch(served, nc, name) as reader:
            received = b""
            with contextlib.suppress(TimeoutError):
                while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
                    received += chunk
                    if b"kv.watch_too_slow" in received:
                        break
            tail = received[-2000:].decode(errors="replace")
            assert "event: error" in tail and "kv.watch_too_slow" in tail
            assert received.count(b"event: put") < 150


async def test_watch_survives_a_server_restart(own_nats_server: EmbeddedServer, name: str) -> None:
    settings = gateway_settings(own_nats_server.url, kv_watch_heartbeat=0.5)
    with served_gateway(settings) as served:
        async with httpx.AsyncClient(base_url=served, timeout=10) as http:
            await bucket(http, name, history=10, storage="file")
            await put(http, name, "k", b"1")
            async with watching(http, name) as sse:
                assert [e.id for e in await sse.until("ready")] == ["1", "1"]
                await put(http, name, "k", b"2")
                assert (await sse.next()).id == "2"
                await asyncio.to_thread(own_nats_server.restart)
                # Written while the gateway is still finding its way back.
                nc = await nats.connect(own_nats_server.url)
                try:
                    js = nc.jetstream()
                    for value in (b"3", b"4", b"5"):
                        await js.publish(f"$KV.{name}.k", value)
                finally:
                    await nc.close()
                seen = [await sse.next(timeout=15) for _ in range(3)]
                assert [(e.event, e.id) for e in seen] == [("put", "3"), ("put", "4"), ("put", "5")]
                assert [base64.b64decode(e.json["value"]) for e in seen] == [b"3", b"4", b"5"]
                await put(http, name, "k", b"6")
                assert (await sse.next(timeout=10)).id == "6"


async def test_gateway_shutdown_ends_watches_with_an_error(
    client: httpx.AsyncClient, name: str
) -> None:
    from sse_starlette.sse import AppStatus

    await bucket(client, name)
    async with watching(client, name) as sse:
        await sse.until("ready")
        AppStatus.should_exit = True  # what uvicorn's signal handler sets on SIGTERM
        try:
            farewell = await sse.next(timeout=5)
        finally:
            AppStatus.should_exit = False
        assert farewell.event == "error" and farewell.json["code"] == "gateway.shutdown"
        with pytest.raises(EOFError):
            await sse.next(comments=True)


async def test_a_watch_with_an_unread_body_ends_when_its_client_leaves(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """uvicorn stops reading a connection with over 64 KiB of body unread, and a connection
    not read does not tell its loss: the watch must still end at once when the client leaves
    (not at the next failed heartbeat, seconds later)."""
    settings = gateway_settings(nats_server.url, sse_heartbeat=5.0, kv_watch_heartbeat=5.0)
    with served_gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.put(f"/v1/kv/{name}", json={})).status_code == 201
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for body in (0, 200_000):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"GET /v1/kv/{name}/watch?updates_only=true HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {body}\r\n\r\n".encode()
                + b"a" * body
            )
            got = b""
            while b"event: ready" not in got:
                got += await asyncio.wait_for(reader.read(65536), 5)
            assert await consumer_count(nc, name) == 1  # the bucket's feed
            writer.close()
            started = time.monotonic()
            while await consumer_count(nc, name) and time.monotonic() - started < 12:
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            assert took < 1.0, f"body of {body} bytes: the watch ended {took:.1f} s after"


async def test_the_leader_read_that_completes_a_catch_up(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """What a watch reads from the stream leader when its catch-up ran on a replica behind
    (app.kv.watch; tests/faults/test_watch_replica.py has the replica): the next message of
    the filter from a sequence, markers included, on every release the KV tests run on."""
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=name, history=5)
    await kv.put("a.1", b"1")  # 1
    await kv.put("b", b"2")  # 2
    await kv.delete("a.1")  # 3
    await kv.put("a.2", b"4")  # 4
    app = create_app(gateway_settings(nats_server.url))
    async with app.router.lifespan_context(app) as state:
        js = state["runtime"].js
        stream, subject = f"KV_{name}", f"$KV.{name}.a.>"
        found = []
        for seq in (1, 2, 4, 5):
            message = await watch_leader_next(js, stream, subject, seq)
            found.append(None if message is None else entry_from_message(name, message))
    assert [(e.revision, e.key, e.operation, e.value) for e in found[:3]] == [
        (1, "a.1", "PUT", b"1"),
        (3, "a.1", "DEL", b""),
        (4, "a.2", "PUT", b"4"),
    ]
    assert found[3] is None
