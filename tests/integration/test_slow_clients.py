"""Clients that hold connections without finishing requests (app.serving): silent sockets,
request heads sent a byte at a time, idle keep-alive connections, and more connections than a
worker takes. A real uvicorn serves the app, as ``jsgw serve`` does."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import orjson
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway

HEAD_TIMEOUT = 2.0
SLACK = 1.5  # the loop's timer resolution, and hundreds of sockets closing in one turn


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _closed_after(reader: asyncio.StreamReader, started: float) -> float:
    """Seconds from ``started`` until the server closed the connection (EOF or reset)."""
    try:
        while await reader.read(4096):
            pass
    except ConnectionError:
        pass
    return time.monotonic() - started


async def _silent(port: int) -> float:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await _closed_after(reader, started)
    finally:
        writer.close()


async def _slow_head(port: int, interval: float) -> float:
    """A head sent a byte every ``interval`` seconds, never finished in time."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    closed = asyncio.ensure_future(_closed_after(reader, started))
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: jsgw\r\nX-Slow: " + b"a" * 1000:
            if closed.done():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait([closed], timeout=interval)
        return await closed
    finally:
        writer.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_silent_and_slow_heads_are_closed_while_requests_go_on(
    nats_server: EmbeddedServer, name: str
) -> None:
    settings = gateway_settings(nats_server.url, header_timeout=HEAD_TIMEOUT)
    with served_gateway(settings) as url:
        port = _port(url)
        async with httpx.AsyncClient(base_url=url, timeout=10) as gw:
            assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
            assert (await gw.put(f"/v1/kv/{name}/keys/k", content=b"v")).status_code == 200
            before = _open_descriptors()
            hostile = [asyncio.ensure_future(_silent(port)) for _ in range(200)]
            hostile += [asyncio.ensure_future(_slow_head(port, 0.25)) for _ in range(200)]
            await asyncio.sleep(0.5)
            during = _open_descriptors()
            # Normal reads meanwhile, each on a fresh connection and on a kept-alive one.
            latencies = []
            give_up = time.monotonic() + HEAD_TIMEOUT + 10
            while not all(task.done() for task in hostile):
                if time.monotonic() > give_up:
                    open_ = sum(not task.done() for task in hostile)
                    for task in hostile:
                        task.cancel()
                    raise AssertionError(f"{open_} of 400 sockets still open after 12 s")
                started = time.monotonic()
                response = await gw.get(f"/v1/kv/{name}/keys/k")
                latencies.append(time.monotonic() - started)
                assert response.status_code == 200 and response.content == b"v"
                await asyncio.sleep(0.02)
            closed_after = [task.result() for task in hostile]
        await asyncio.sleep(0.2)
        after = _open_descriptors()
    assert during >= before + 400  # both ends of each socket live in this process
    assert max(closed_after) < HEAD_TIMEOUT + SLACK, max(closed_after)
    assert min(closed_after) >= HEAD_TIMEOUT - 0.1, min(closed_after)
    assert after <= before + 10, (before, after)
    latencies.sort()
    assert len(latencies) >= 20
    assert latencies[int(len(latencies) * 0.99)] < 1.0


async def test_streams_and_slow_bodies_are_not_bounded_by_the_head_timeout(
    nats_server: EmbeddedServer, name: str
) -> None:
    settings = gateway_settings(nats_server.url, header_timeout=1.0)
    with served_gateway(settings) as url:
        port = _port(url)
        async with httpx.AsyncClient(base_url=url, timeout=10) as gw:
            assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
            assert (
                await gw.put(f"/v1/streams/{name}S", json={"subjects": [f"{name}.>"]})
            ).status_code == 201
            async with gw.stream("GET", f"/v1/kv/{name}/watch") as watch:
                assert watch.status_code == 200
                lines = watch.aiter_lines()
                await asyncio.sleep(2.5)  # past the head timeout
                assert (await gw.put(f"/v1/kv/{name}/keys/late", content=b"x")).status_code == 200
                seen = []
                while not any("late" in line for line in seen):
                    seen.append(await asyncio.wait_for(anext(lines), 5))
            # A body trickling in for 2.5 s after a complete head: published.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b"0123456789"
            writer.write(
                b"POST /v1/publish/%s.slow HTTP/1.1\r\nHost: jsgw\r\nContent-Length: %d\r\n\r\n"
                % (name.encode(), len(body))
            )
            for byte in body:
                await asyncio.sleep(0.25)
                writer.write(bytes([byte]))
                await writer.drain()
            answer = await asyncio.wait_for(reader.read(4096), 5)
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert b'"seq":1' in answer


# A request uvicorn's parser reads, and a lean path's read whole (app.serving): the bucket
# does not exist, so a 404, answered all the same.
FIRST = {
    "uvicorn": (b"GET /healthz HTTP/1.1\r\nHost: jsgw\r\n\r\n", b"HTTP/1.1 200"),
    "whole": (b"GET /v1/kv/B/keys/k HTTP/1.1\r\nHost: jsgw\r\n\r\n", b"HTTP/1.1 404"),
}


@pytest.mark.parametrize("first", sorted(FIRST))
async def test_an_idle_keep_alive_connection_is_closed(
    nats_server: EmbeddedServer, first: str
) -> None:
    request, status = FIRST[first]
    settings = gateway_settings(nats_server.url, keep_alive_timeout=1.0, header_timeout=30)
    with served_gateway(settings) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
        writer.write(request)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(status)
        idle_after = await asyncio.wait_for(_closed_after(reader, time.monotonic()), 10)
        writer.close()
    assert 0.9 <= idle_after < 1.0 + SLACK, idle_after


async def _answered_then(url: str, first: str, then: bytes, interval: float) -> float:
    """One request (``FIRST``) answered on a kept-alive connection, then ``then`` sent a byte
    every ``interval`` seconds: seconds until the gateway closed the connection."""
    request, status = FIRST[first]
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(status)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        started = time.monotonic()
        closed = asyncio.ensure_future(_closed_after(reader, started))
        for byte in then:
            if closed.done():
                break
            writer.write(bytes([byte]))
            await asyncio.wait([closed], timeout=interval)
        return await asyncio.wait_for(closed, 10)
    finally:
        writer.close()


@pytest.mark.parametrize("first", sorted(FIRST))
async def test_a_later_head_or_stray_bytes_on_a_kept_alive_connection_are_bounded(
    nats_server: EmbeddedServer, first: str
) -> None:
    # keep-alive longer than the head bound, and bytes sooner than either: only the head
    # bound can close these connections.
    settings = gateway_settings(nats_server.url, keep_alive_timeout=5.0, header_timeout=1.0)
    with served_gateway(settings) as url:
        second_head = b"GET /healthz HTTP/1.1\r\nHost: jsgw\r\nX-Slow: " + b"a" * 100
        slow = await _answered_then(url, first, second_head, 0.2)
        # (No request begins: no parser callback.)
        stray = await _answered_then(url, first, b"\r\n", 0.2)
    assert 0.9 <= slow < 1.0 + SLACK, slow
    assert 0.9 <= stray < 1.0 + SLACK, stray


async def test_connections_past_the_cap_are_answered_503_and_closed(
    nats_server: EmbeddedServer,
) -> None:
    settings = gateway_settings(nats_server.url, max_connections=20, header_timeout=30)
    with served_gateway(settings) as url:
        port = _port(url)
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        await asyncio.sleep(0.2)
        # A client that sends its request at once, as clients do: the 503 reaches it.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"PUT /v1/kv/B/keys/k HTTP/1.1\r\nHost: jsgw\r\nContent-Length: 5\r\n\r\nvalue"
        )
        answer = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 5):  # until closed
            answer += chunk
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"retry-after: 1" in head and b"application/problem+json" in head
        problem = orjson.loads(body)
        assert problem["code"] == "http.connection_limit" and problem["status"] == 503
        # A held connection that leaves makes room for the next client.
        _, first = held.pop()
        first.close()
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=url, timeout=5) as gw:
            assert (await gw.get("/healthz")).status_code == 200
            # Full again (gw keeps its connection): another HTTP client sees the problem too.
            async with httpx.AsyncClient(base_url=url, timeout=5) as other:
                refused = await other.get("/healthz")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["code"] == "http.connection_limit"
        for _, w in held:
            w.close()
