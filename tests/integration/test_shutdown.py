"""Graceful shutdown is bounded: an SSE client that stopped reading (its socket buffers full)
does not hold the gateway's exit until uvicorn's own timeout."""

from __future__ import annotations

import asyncio
import socket
import time

import nats
import pytest
from sse_starlette.sse import AppStatus

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway

EVENTS = 2000
VALUE = b"x" * 8192  # 2,000 events of 8 KiB: far more than every socket buffer on the way
BOUND = 4.0  # seconds from the request to exit until the server has stopped


def _stalled_client(url: str, path: str) -> socket.socket:
    """A connection that reads the response head and then nothing more."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(10)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("kind", ["kv watch", "consume"])
async def test_a_stalled_sse_client_does_not_hold_shutdown(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str, kind: str
) -> None:
    js = nc.jetstream()
    if kind == "kv watch":
        await js.create_key_value(bucket=name)
        path, subject = f"/v1/kv/{name}/watch", f"$KV.{name}.k{{}}"
    else:
        await js.add_stream(name=name, subjects=[f"{name}.>"])
        await js.add_consumer(name, durable_name="C", ack_policy="explicit")
        path, subject = f"/v1/streams/{name}/consumers/C/consume", f"{name}.k{{}}"
    try:
        with served_gateway(gateway_settings(nats_server.url)) as url:
            sock = await asyncio.to_thread(_stalled_client, url, path)
            for i in range(EVENTS):
                await nc.publish(subject.format(i % 50), VALUE)
            await nc.flush()
            await asyncio.sleep(1)  # the gateway writes until the socket takes no more
            AppStatus.should_exit = True  # what uvicorn's signal handler sets on SIGTERM
            started = time.monotonic()
        # (Leaving the block asked the server to exit and waited for its thread to end.)
        took = time.monotonic() - started
    finally:
        AppStatus.should_exit = False
    try:
        print(f"shutdown took {took:.2f} s")
        assert took < BOUND, f"shutdown took {took:.1f} s"
        assert await asyncio.to_thread(_closed_by_server, sock)
    finally:
        sock.close()
