"""The push deliveries' HTTP/1.1 client (app/push/transport.py) against real servers on
loopback sockets: a plain asyncio server that answers what each test scripts, byte for byte."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.push import transport as lean
from app.push.transport import (
    Answer,
    AnswerTooLarge,
    Client,
    ConnectFailed,
    ConnectionBroke,
    Endpoint,
    NotHttp,
)
from tests.integration.test_tls import issue, openssl
from tests.push_app import free_port


class Close(bytes):
    """An answer after which the server closes the connection."""


STALL = Close(b"")
"""No answer: the server keeps the connection open and says nothing."""

Script = Callable[[int, bytes], bytes | None]
"""(request number, request bytes) -> the answer's bytes (None: close without answering)."""


@dataclass
class Server:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@asynccontextmanager
async def serving(script: Script, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    port = free_port()
    server = Server(f"{'https' if tls else 'http'}://127.0.0.1:{port}/in?x=1")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                server.requests.append(request)
                answer = script(len(server.requests), request)
                if answer is None:
                    return
                if answer is STALL:
                    await asyncio.sleep(30)
                writer.write(answer)
                await writer.drain()
                if isinstance(answer, Close) or b"connection: close" in answer.lower():
                    return
        finally:
            writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", port, ssl=tls)
    try:
        yield server
    finally:
        listening.close()


@asynccontextmanager
async def client(max_body: int = 1024, ca_file: str | None = None) -> AsyncIterator[Client]:
    http = Client(max_body, [("User-Agent", "t/1")], ca_file=ca_file)
    try:
        yield http
    finally:
        await http.aclose()


def ok(body: bytes = b"done", *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body) + b"".join(extra)
    return head + b"\r\n" + body


async def post(http: Client, url: str, body: bytes = b"payload") -> Answer:
    return await http.post(Endpoint.parse(url), [("X-A", "1"), ("X-A", "2")], body)


async def test_connections_are_kept_and_requests_sent_as_given() -> None:
    async with serving(lambda n, _: ok(b"answer %d" % n)) as server, client() as http:
        for n in range(1, 21):
            answer = await post(http, server.url)
            assert (answer.status, answer.body) == (200, b"answer %d" % n)
        assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /in?x=1 HTTP/1.1\r\n")
    assert f"Host: {server.url.split('/')[2]}\r\n".encode() in first
    assert b"X-A: 1\r\nX-A: 2\r\n" in first and b"Content-Length: 7\r\n" in first
    assert b"User-Agent: t/1\r\n" in first
    assert first.endswith(b"\r\n\r\npayload")


async def test_chunked_and_close_delimited_answers() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 202 Accepted\r\nConnection: close\r\n\r\nto the end"
    answers = {1: chunked, 2: until_close}
    async with serving(lambda n, _: answers.get(n, ok())) as server, client() as http:
        first = await post(http, server.url)
        assert (first.status, first.body) == (200, b"abcde")
        second = await post(http, server.url)
        assert (second.status, second.body) == (202, b"to the end")
        third = await post(http, server.url)  # a new connection: the last one was closed
        assert third.status == 200
        assert server.connections == 2


async def test_an_answer_over_the_limit_is_refused_and_its_connection_dropped() -> None:
    big = ok(b"x" * 5000)
    async with serving(lambda n, _: big if n == 1 else ok()) as server, client(1024) as http:
        with pytest.raises(AnswerTooLarge):
            await post(http, server.url)
        assert (await post(http, server.url)).status == 200
        assert server.connections == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (None, ConnectionBroke),  # closed without a word (a new connection: not sent again)
        (Close(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"), ConnectionBroke),
        (b"SMTP ready\r\n\r\n", NotHttp),
    ],
)
async def test_broken_answers(answer: bytes | None, error: type[Exception]) -> None:
    async with serving(lambda n, _: answer if n == 1 else ok()) as server, client() as http:
        with pytest.raises(error):
            await asyncio.wait_for(post(http, server.url), 5)
        assert (await post(http, server.url)).status == 200
        assert server.connections == 2


async def test_a_refused_connection() -> None:
    async with client() as http:
        with pytest.raises(ConnectFailed):
            await post(http, f"http://127.0.0.1:{free_port()}/in")


async def test_a_cancelled_request_closes_its_connection() -> None:
    async with serving(lambda n, _: STALL if n == 1 else ok()) as server, client() as http:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await post(http, server.url)
        assert (await post(http, server.url)).status == 200
        assert server.connections == 2


async def test_an_idle_connection_is_not_used_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean, "IDLE", 0.1)
    async with serving(lambda n, _: ok()) as server, client() as http:
        await post(http, server.url)
        await post(http, server.url)
        await asyncio.sleep(0.2)
        await post(http, server.url)
        assert server.connections == 2


async def test_a_request_on_a_connection_closed_under_it_goes_once_more_on_a_new_one() -> None:
    """The server closes a kept connection without reading the request that went out on it
    (as a server closing idle connections does): the request is sent again on a new
    connection, once; a connection that said something of an answer is not retried."""
    async with serving(lambda n, _: None if n == 2 else ok(b"%d" % n)) as server, client() as h:
        assert (await post(h, server.url)).body == b"1"
        # request 2: read, then the connection closed with nothing said; 3 on a new one
        assert (await post(h, server.url)).body == b"3"
        assert server.connections == 2 and len(server.requests) == 3
    half = Close(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
    async with serving(lambda n, _: half if n == 2 else ok()) as server, client() as h:
        await post(h, server.url)
        with pytest.raises(ConnectionBroke):
            await post(h, server.url)
        assert len(server.requests) == 2


async def test_answers_headers_by_lower_case_name_and_utf8_values_sent() -> None:
    answer = ok(b"", b"Retry-After: 3\r\n", b"X-B: 1\r\n", b"x-b: 2\r\n")
    async with serving(lambda n, _: answer) as server, client() as http:
        got = await http.post(Endpoint.parse(server.url), [("X-Name", "caf\u00e9")], b"")
        assert got.headers["retry-after"] == "3" and got.headers["x-b"] == "1, 2"
    assert "X-Name: café\r\n".encode() in server.requests[0]


@pytest.fixture
def app_pki(tmp_path: Path) -> Path:
    """A private CA and an application certificate it issued (for 127.0.0.1 and localhost)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    args = ("-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-subj", "/CN=app-ca")
    openssl("req", "-x509", *args, "-days", "2", "-out", "ca.pem", cwd=tmp_path)
    issue(tmp_path, "ca", "app", "/CN=localhost", server=True)
    return tmp_path


async def test_https_endpoints_are_verified_against_the_configured_ca(app_pki: Path) -> None:
    """JSGW_PUSH_CA: an application whose certificate a private CA issued is reached with that
    CA's certificate, and refused without it (the system's CAs do not know it)."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(app_pki / "app.pem", app_pki / "app.key")
    async with serving(lambda n, _: ok(b"secure"), tls) as server:
        async with client(ca_file=str(app_pki / "ca.pem")) as http:
            assert (await post(http, server.url)).body == b"secure"
        async with client() as http:
            with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await post(http, server.url)
    with pytest.raises(ssl.SSLError):
        Client(1024, ca_file=str(app_pki / "app.key"))  # not certificates: refused at once
