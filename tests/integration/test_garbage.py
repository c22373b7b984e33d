"""Answering a request leaves no reference cycles behind.

Objects in a cycle outlive their request until the garbage collector finds them, and every
collection walks all the young objects: a dozen such objects per request made the collector
a tenth of a busy gateway's CPU. Requests here go through the real server (uvicorn with the
gateway's protocol), whose ``send`` is bound to the object holding the request's scope.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, running_gateway, served_gateway

REQUESTS = 100
ATTEMPTS = 3


@pytest.fixture(scope="module")
def base_url(nats_server: EmbeddedServer) -> Iterator[str]:
    with served_gateway(gateway_settings(nats_server.url)) as url:
        yield url


class Connection:
    """One keep-alive HTTP/1.1 connection, read by hand (no client library's own objects)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""

    def request(self, method: str, path: str, body: bytes = b"") -> int:
        head = f"{method} {path} HTTP/1.1\r\nHost: gateway\r\n"
        if body or method in ("PUT", "POST"):
            head += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head_bytes, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        while len(self.buffer) < length:
            self.buffer += self._recv()
        self.buffer = self.buffer[length:]
        return int(lines[0].split()[1])

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        assert data, "the server closed the connection"
        return data

    def close(self) -> None:
        self.sock.close()


def _cycles_per_request(url: str, method: str, path: str, body: bytes, status: int) -> float:
    """Objects in cycles per request, the least of ``ATTEMPTS`` runs of ``REQUESTS``.

    The collector counts the whole process's garbage: the served gateway's own housekeeping
    and what other tests left running can put one cycle (an exception's traceback and its
    frames: a few dozen objects) into one run. A request that leaves a cycle does so in
    every run."""
    connection = Connection(url)
    try:
        for _ in range(5):  # warm: caches, lazily built stacks
            assert connection.request(method, path, body) == status
        least = None
        for _ in range(ATTEMPTS):
            gc.collect()
            gc.disable()
            try:
                for _ in range(REQUESTS):
                    assert connection.request(method, path, body) == status
                found = gc.collect()
            finally:
                gc.enable()
            least = found if least is None else min(least, found)
            if not least:
                break
    finally:
        connection.close()
    assert least is not None
    return least / REQUESTS


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/kv/{b}/keys/k", b"", 200),  # the lean read
        ("PUT", "/v1/kv/{b}/keys/k", b"v", 200),  # the lean write
        ("GET", "/v1/kv/{b}/keys/missing", b"", 404),
        ("GET", "/v1/kv/{b}", b"", 200),  # through FastAPI
        ("GET", "/v1/kv/{b}/keys/a..b", b"", 400),
        ("GET", "/healthz", b"", 200),
    ],
)
def test_a_request_leaves_no_cycles(
    base_url: str, name: str, method: str, path: str, body: bytes, status: int
) -> None:
    setup = Connection(base_url)
    try:
        assert setup.request("PUT", f"/v1/kv/{name}", b"{}") == 201
        assert setup.request("PUT", f"/v1/kv/{name}/keys/k", b"value") == 200
    finally:
        setup.close()
    found = _cycles_per_request(base_url, method, path.format(b=name), body, status)
    # Before the fix every request left 14 objects in a cycle; allow for the odd object from
    # the server's own housekeeping during the run.
    assert found < 0.2, f"{found:.1f} objects in cycles per request"


def test_no_server_header(base_url: str) -> None:
    """The server is served as `jsgw serve` serves it: no Server header naming the stack."""
    connection = Connection(base_url)
    try:
        connection.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        while b"\r\n\r\n" not in connection.buffer:
            connection.buffer += connection._recv()
    finally:
        connection.close()
    head = connection.buffer.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200") and b"\r\ndate: " in head
    assert b"\r\nserver:" not in head


async def test_an_app_leaves_the_process_collector_alone(nats_server: EmbeddedServer) -> None:
    """Tuning the collector is the serving process's (app.serving.tune_gc_once_started, by
    ``jsgw serve``), not an app's: tests start many apps in one process."""
    before = gc.get_threshold(), gc.get_freeze_count()
    async with running_gateway(gateway_settings(nats_server.url)) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (gc.get_threshold(), gc.get_freeze_count()) == before
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
