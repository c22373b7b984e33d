"""Core NATS subscribe over SSE: messages, wildcards, queue groups shared by HTTP clients,
reserved namespaces, and slow consumers cut off with a bounded backlog."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote

import httpx
import nats
import orjson
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway
from tests.integration.test_kv_watch import SSE


@pytest.fixture
def served(nats_server: EmbeddedServer) -> Iterator[str]:
    settings = gateway_settings(nats_server.url, sse_heartbeat=0.5)
    with served_gateway(settings) as url:
        yield url


@pytest.fixture
async def http(served: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served, timeout=10) as client:
        yield client


PROBE = b"probe"


@contextlib.asynccontextmanager
async def subscribed(
    http: httpx.AsyncClient,
    subject: str,
    headers: dict[str, str] | None = None,
    *,
    settle: tuple[str, str] | None = None,
    **params: str,
) -> AsyncIterator[SSE]:
    """An open subscribe stream. ``settle``: (NATS URL, a subject the stream gets) probed from
    a connection of its own until the stream gets a probe (which is then read off)."""
    url = f"/v1/nats/subscribe/{quote(subject)}"
    async with http.stream("GET", url, params=params, headers=headers) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = SSE(r)
        if settle is not None:
            await _settle(events, *settle)
        yield events


async def _settle(events: SSE, nats_url: str, probe_subject: str) -> None:
    probe = await nats.connect(nats_url)
    try:
        for _ in range(100):
            try:
                await probe.request(probe_subject, PROBE, timeout=0.2)
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.02)
                continue
            except nats.errors.TimeoutError:
                pass  # delivered (the stream does not answer)
            break
        # The one probe delivered (a no-responders answer means none was) is read off.
        event = await events.next(timeout=5)
        assert base64.b64decode(orjson.loads(event.data)["data"]) == PROBE
    finally:
        await probe.close()


async def has_responders(nc: nats.NATS, subject: str) -> bool:
    """Whether anyone (a subscription of the gateway) listens on ``subject``."""
    try:
        await nc.request(subject, b"", timeout=0.2)
    except nats.errors.NoRespondersError:
        return False
    except nats.errors.TimeoutError:
        return True
    return True


async def settled_responders(nc: nats.NATS, subject: str, expected: bool) -> bool:
    for _ in range(50):
        if await has_responders(nc, subject) == expected:
            return expected
        await asyncio.sleep(0.05)
    return not expected


async def test_messages_on_a_wildcard_arrive_as_message_json(
    http: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    settle = (nats_server.url, f"{name}.probe.temp")
    async with subscribed(http, f"{name}.*.temp", settle=settle) as events:
        await nc.publish(f"{name}.eu.temp", b"21.5", headers={"X-Trace": "t1"})
        await nc.publish(f"{name}.eu.humidity", b"no")  # not matched
        await nc.publish(f"{name}.us.temp", b"\x00\xff")
        first = await events.next()
        second = await events.next()
    assert first.event == "message" and first.id is None
    body = orjson.loads(first.data)
    assert set(body) == {"subject", "time", "headers", "data"}  # no stream, no seq
    assert body["subject"] == f"{name}.eu.temp"
    assert body["headers"] == {"X-Trace": ["t1"]}
    assert base64.b64decode(body["data"]) == b"21.5"
    assert body["time"].endswith("Z")
    other = orjson.loads(second.data)
    assert other["subject"] == f"{name}.us.temp"
    assert base64.b64decode(other["data"]) == b"\x00\xff"
    assert other["headers"] == {}
    for _ in range(50):  # (a stream is counted once the server has seen its end)
        metrics = (await http.get("/metrics")).text
        if 'route="/v1/nats/subscribe/{subject}"' in metrics:  # the template, not the subject
            break
        await asyncio.sleep(0.05)
    assert 'route="/v1/nats/subscribe/{subject}"' in metrics
    sent = re.search(r"^jsgw_core_subscribe_messages_total (\S+)$", metrics, re.M)
    assert sent is not None and float(sent.group(1)) >= 3  # the probe, then the two
    assert f"{name}.eu" not in metrics


async def test_gateway_shutdown_ends_subscriptions_with_an_error(
    http: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    from sse_starlette.sse import AppStatus

    subject = f"{name}.bye"
    async with subscribed(http, subject, settle=(nats_server.url, subject)) as events:
        await nc.publish(subject, b"1")
        assert (await events.next()).event == "message"
        AppStatus.should_exit = True  # what uvicorn's signal handler sets on SIGTERM
        try:
            farewell = await events.next(timeout=5)
        finally:
            AppStatus.should_exit = False
        assert farewell.event == "error"
        assert orjson.loads(farewell.data)["code"] == "gateway.shutdown"
        with pytest.raises(EOFError):
            await events.next(comments=True)
    assert not await settled_responders(nc, subject, False)


async def test_what_the_gateway_publishes_reaches_its_own_subscribers(
    http: httpx.AsyncClient, nats_server: EmbeddedServer, name: str
) -> None:
    settle = (nats_server.url, f"{name}.probe")
    async with subscribed(http, f"{name}.>", settle=settle) as events:
        response = await http.post(
            f"/v1/nats/publish/{name}.a.b", content=b"x", headers={"Nats-Header-X-A": "1"}
        )
        assert response.status_code == 202
        body = orjson.loads((await events.next()).data)
    assert body["subject"] == f"{name}.a.b"
    assert body["headers"] == {"X-A": ["1"]}


async def test_leaving_ends_the_nats_subscription(
    http: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    subject = f"{name}.leave"
    assert not await has_responders(nc, subject)
    async with subscribed(http, subject) as events:
        assert await settled_responders(nc, subject, True)
        await events.next(comments=True)  # an event or a heartbeat: the stream is up
    assert await settled_responders(nc, subject, False) is False


async def test_queue_groups_split_messages_between_http_clients(
    http: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    subject = f"{name}.jobs"
    count = 200
    async with (
        subscribed(http, f"{name}.*", queue="workers") as a,
        subscribed(http, f"{name}.*", queue="workers") as b,
        subscribed(http, f"{name}.*", settle=(nats_server.url, f"{name}.probe")) as everyone,
    ):
        for i in range(count):
            await nc.publish(subject, str(i).encode())
        await nc.flush()
        got_all = [orjson.loads((await everyone.next()).data)["data"] for _ in range(count)]
        got: dict[str, list[int]] = {"a": [], "b": []}

        async def drain(label: str, events: SSE) -> None:
            with contextlib.suppress(TimeoutError):
                while True:
                    event = await events.next(timeout=1.0)
                    data = base64.b64decode(orjson.loads(event.data)["data"])
                    if data != PROBE:  # (everyone's probes reach the group too)
                        got[label].append(int(data))

        await asyncio.gather(drain("a", a), drain("b", b))
    assert len(got_all) == count
    # Each message went to exactly one member; both members had a share.
    assert sorted(got["a"] + got["b"]) == list(range(count))
    assert got["a"] and got["b"], got


@pytest.mark.parametrize(
    ("subject", "code"),
    [
        (">", "nats.subject_reserved"),
        ("*.x", "nats.subject_reserved"),
        ("*", "nats.subject_reserved"),
        ("$JS.>", "nats.subject_reserved"),
        ("$JS.API.>", "nats.subject_reserved"),
        ("$KV.b.>", "nats.subject_reserved"),
        ("$O.>", "nats.subject_reserved"),
        ("$SYS.>", "nats.subject_reserved"),
        ("_INBOX.>", "nats.subject_reserved"),
        ("_R_.>", "nats.subject_reserved"),
        ("a.>.b", "subject.filter_invalid"),
        ("a..b", "subject.filter_invalid"),
        ("a b", "subject.filter_invalid"),
        ("a.b*", "subject.filter_invalid"),
    ],
)
async def test_reserved_and_invalid_filters_are_refused(
    http: httpx.AsyncClient, subject: str, code: str
) -> None:
    problem(await http.get(f"/v1/nats/subscribe/{quote(subject)}"), 400, code)


async def test_bad_queue_names_are_refused(http: httpx.AsyncClient, name: str) -> None:
    for queue in ("", "a b", "x" * 129, "q\r\n", "a*"):
        problem(
            await http.get(f"/v1/nats/subscribe/{name}.x", params={"queue": queue}),
            400,
            "nats.queue_invalid",
        )


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def test_a_client_that_reads_nothing_is_cut_off_as_a_slow_consumer(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """A client that reads nothing while 64 MiB are published: the gateway holds at most its
    bounds for it, drops the NATS subscription, and the client, once it reads, gets what
    was queued, the error, and the end."""
    settings = gateway_settings(
        nats_server.url, sse_queue_size=50, nats_subscribe_queue_bytes=512 * 1024
    )
    subject = f"{name}.flood"
    with served_gateway(settings) as url:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        sock.connect((host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(f"GET /v1/nats/subscribe/{subject} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            assert b"200" in await reader.readline()
            assert await has_responders(nc, subject)
            before = peak = _rss()
            payload = b"m" * 32 * 1024
            published = 0
            for i in range(2048):  # 64 MiB
                await nc.publish(subject, payload)
                published += 1
                if i % 64 == 63:
                    await nc.flush()
                    peak = max(peak, _rss())
                    if not await has_responders(nc, subject):
                        break
            # Cut off: the gateway unsubscribed long before the flood's end.
            assert not await settled_responders(nc, subject, False)
            assert published < 2048, "the slow client was never cut off"
            # More after the cut: the gateway no longer receives them.
            for _ in range(256):
                await nc.publish(subject, payload)
            await nc.flush()
            peak = max(peak, _rss())
            assert peak - before < 24 * 1024 * 1024, (peak - before) / 2**20
            received = b""
            with contextlib.suppress(TimeoutError):
                while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
                    received += chunk
                    if received.endswith(b"0\r\n\r\n"):
                        break
            assert received.endswith(b"0\r\n\r\n"), received[-300:]  # the stream's end
            events = received.count(b"event: message")
            assert 0 < events <= 50 + 30, events  # the queue, and what buffers held
            tail = received[-3000:].decode(errors="replace")
            assert "event: error" in tail and "nats.slow_consumer" in tail
        finally:
            writer.close()
        async with httpx.AsyncClient(base_url=url) as http:
            metrics = (await http.get("/metrics")).text
    assert "jsgw_core_subscribe_slow_consumers_total 1.0" in metrics
    assert 'jsgw_sse_streams_open{kind="core_subscribe"} 0.0' in metrics


async def test_subscriptions_take_sse_slots(nats_server: EmbeddedServer, name: str) -> None:
    settings = gateway_settings(nats_server.url, sse_max_per_address=1)
    with served_gateway(settings) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as http,
            subscribed(http, f"{name}.a"),
        ):
            async with http.stream("GET", f"/v1/nats/subscribe/{name}.b") as second:
                await second.aread()
            assert second.status_code == 429
            assert second.json()["code"] == "sse.too_many_streams"
            assert "retry-after" in second.headers
        # The slot is given back with the stream.
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            for _ in range(50):
                async with http.stream("GET", f"/v1/nats/subscribe/{name}.c") as third:
                    if third.status_code == 200:
                        break
                    await third.aread()
                await asyncio.sleep(0.05)
            assert third.status_code == 200


async def test_a_subscription_survives_a_server_restart(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    """The client's connection re-subscribes after a reconnect: what is published once the
    server is back reaches the stream (what was published while it was down is gone, as for
    any core subscriber)."""
    settings = gateway_settings(own_nats_server.url, sse_heartbeat=0.5)
    subject = f"{name}.restart"
    with served_gateway(settings) as served:
        async with (
            httpx.AsyncClient(base_url=served, timeout=10) as http,
            subscribed(http, subject) as events,
        ):
            await asyncio.to_thread(own_nats_server.restart)
            nc = await nats.connect(own_nats_server.url)
            try:
                # (the probes are messages on the subject too: empty ones)
                assert await settled_responders(nc, subject, True)  # re-subscribed
                await nc.publish(subject, b"after")
                await nc.flush()
                data = b""
                while not data:
                    event = await events.next(timeout=10)
                    assert event.event == "message"
                    data = base64.b64decode(orjson.loads(event.data)["data"])
                assert data == b"after"
            finally:
                await nc.close()
