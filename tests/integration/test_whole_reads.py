"""Requests read whole (app.serving.GatheringProtocol._serve_whole) are answered as uvicorn's
parser has them answered.

Each request is sent twice to the same gateway on a real socket: in one write (read whole,
when it is a lean route's) and with its head cut in two writes a moment apart (uvicorn's
parser reads it, as before). The answers, and the scopes the lean paths were given, must be
the same."""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import nats
import pytest

from app import fastpath, serving
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway

# What differs between two answers to the same request, whoever reads it.
_OWN = (b"date", b"x-request-id")
# What the scope of a request read whole must hold as uvicorn's parser makes it.
_SCOPE = (
    "type",
    "asgi",
    "http_version",
    "server",
    "scheme",
    "root_path",
    "headers",
    "method",
    "path",
    "raw_path",
    "query_string",
    "extensions",
)


@pytest.fixture
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each read that could hold a request was served whole."""
    served: list[bool] = []
    original = serving.GatheringProtocol._serve_whole

    def spy(self: serving.GatheringProtocol, data: bytes) -> bool:
        taken = original(self, data)
        served.append(taken)
        return taken

    monkeypatch.setattr(serving.GatheringProtocol, "_serve_whole", spy)
    return served


@pytest.fixture
def scopes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The scopes the lean paths answered, as they came."""
    seen: list[dict[str, Any]] = []
    original = fastpath.LeanPaths._respond

    async def spy(scope, receive):  # type: ignore[no-untyped-def]
        seen.append({key: scope.get(key) for key in _SCOPE})
        return await original(scope, receive)

    monkeypatch.setattr(fastpath.LeanPaths, "_respond", staticmethod(spy))
    return seen


@pytest.fixture
def gateway(nats_server: EmbeddedServer) -> Iterator[tuple[str, int]]:
    with served_gateway(gateway_settings(nats_server.url)) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


async def _exchange(address: tuple[str, int], parts: list[bytes]) -> bytes:
    """Send ``parts`` on a new connection, a moment apart, and read until it closes or an
    answer is whole."""
    reader, writer = await asyncio.open_connection(*address)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(0.05)
            writer.write(part)
            await writer.drain()
        return await _answer(reader, head_only=parts[0].startswith(b"HEAD "))
    finally:
        writer.close()


async def _answer(reader: asyncio.StreamReader, *, head_only: bool = False) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    body = b""
    if not head.startswith(b"HTTP/1.1 304") and not head_only:
        body = await asyncio.wait_for(reader.readexactly(length), 10) if length else b""
    return head + body


def _comparable(answer: bytes, *, write: bool) -> tuple[bytes, list[bytes], bytes]:
    """An answer without what differs between two answers to the same request (for a write,
    made twice: its status and header names only)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    kept = sorted(line.lower() for line in lines if line.split(b":")[0].lower() not in _OWN)
    for line in lines:  # (a problem's instance is its request id)
        name, _, value = line.partition(b":")
        if name.lower() == b"x-request-id":
            body = body.replace(value.strip(), b"<id>")
    if write:
        return status, [line.split(b":")[0] for line in kept], b""
    return status, kept, body


REQUESTS = [
    b"GET /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/{b}/keys/k?revision=1 HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n",
    b"GET /v1/kv/{b}/keys/a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/{b}/keys/missing HTTP/1.1\r\nHost: x\r\n\r\n",
    b'GET /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\nIf-None-Match: "1"\r\n\r\n',
    b"HEAD /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/{b}/keys/k HTTP/1.0\r\n\r\n",
    b"GET /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET http://x/v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\nX-Request-Id: bad id\r\n\r\n",
    b"GET /v1/kv/{b}/keys/k HTTP/1.1\r\nHost: x\r\nIf-Match: 1\r\nIf-Match: 2\r\n\r\n",
    b"PUT /v1/kv/{b}/keys/p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nvalue",
    b"PUT /v1/kv/{b}/keys/p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b'If-Match: "999"\r\n\r\nvalue',
    b"POST /v1/publish/whole.{b} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Nats-Msg-Id: m-1\r\n\r\nhi",
    b"POST /v1/publish/bad..subject HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
    b"DELETE /v1/kv/{b}/keys/gone HTTP/1.1\r\nHost: x\r\n\r\n",
]


async def test_a_request_read_whole_is_answered_as_one_read_by_uvicorn(
    gateway: tuple[str, int],
    name: str,
    whole_reads: list[bool],
    scopes: list[dict[str, Any]],
) -> None:
    host, port = gateway
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
        assert (await http.put(f"/v1/kv/{name}", json={})).status_code == 201
        assert (await http.put(f"/v1/kv/{name}/keys/k", content=b"value")).status_code == 200
        assert (await http.put(f"/v1/kv/{name}/keys/a/b", content=b"v")).status_code == 200
        stream = await http.put(f"/v1/streams/W{name}", json={"subjects": [f"whole.{name}"]})
        assert stream.status_code in (200, 201), stream.text
    for template in REQUESTS:
        request = template.replace(b"{b}", name.encode())
        whole_reads.clear()
        scopes.clear()
        whole = await _exchange(gateway, [request])
        cut = request.index(b"\r\n") + 3  # (inside the head: no read holds it whole)
        parts = await _exchange(gateway, [request[:cut], request[cut:]])
        assert whole_reads[0] is True, request
        assert True not in whole_reads[1:], request
        write = not request.startswith((b"GET ", b"HEAD "))
        assert _comparable(whole, write=write) == _comparable(parts, write=write), request
        if len(scopes) == 2:  # (a request refused before its route was not given one)
            assert scopes[0] == scopes[1], request


async def test_the_date_of_an_answer_read_whole_is_the_current_one(
    gateway: tuple[str, int], name: str, whole_reads: list[bool]
) -> None:
    """uvicorn's default headers (its date) are written as one block kept per list, and its
    list is a new one each second: answers a second apart carry their own dates."""
    request = f"GET /v1/kv/{name}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    dates = []
    for _ in range(3):
        answer = await _exchange(gateway, [request])
        heads = [line for line in answer.split(b"\r\n") if line.lower().startswith(b"date:")]
        assert len(heads) == 1, answer
        dates.append(email.utils.parsedate_to_datetime(heads[0][5:].strip().decode()))
        now = dt.datetime.now(dt.UTC)
        assert abs((now - dates[-1]).total_seconds()) < 2.5, (now, dates[-1])
        await asyncio.sleep(1.2)
    assert whole_reads == [True, True, True]
    assert dates[0] < dates[2], dates  # (2.4 s apart: uvicorn's date may lag a tick)


async def test_what_a_read_whole_does_not_hold_goes_to_uvicorn(
    gateway: tuple[str, int],
    name: str,
    whole_reads: list[bool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Other routes, a body still to come, two requests in one read, an Expect header, a
    chunked body, a path that is not ASCII, a target without a path, an upgrade: uvicorn's
    parser reads them, and they are answered as before (and the connection's next read may
    still be read whole)."""
    put = b"PUT /v1/kv/%b/keys/p HTTP/1.1\r\nHost: x\r\n" % name.encode()
    cases = [
        [b"GET /v1/kv/%b HTTP/1.1\r\nHost: x\r\n\r\n" % name.encode()],
        [put + b"Content-Length: 5\r\n\r\n", b"value"],
        [put + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\nvalue"],
        [put + b"Transfer-Encoding: chunked\r\n\r\n5\r\nvalue\r\n0\r\n\r\n"],
        [b"GET /v1/kv/%b/keys/\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n" % name.encode()],
        [b"GET http://x HTTP/1.1\r\nHost: x\r\n\r\n"],
        [
            b"GET /v1/kv/%b/keys/k HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\n\r\n" % name.encode()
        ],
    ]
    lean = b"GET /v1/kv/%b/keys/k HTTP/1.1\r\nHost: x\r\n\r\n" % name.encode()
    for parts in cases:
        whole_reads.clear()
        answer = await _exchange(gateway, parts)
        assert answer.startswith(b"HTTP/1.1 "), parts
        assert True not in whole_reads, parts
        # (The loop's reader is shared by its connections: left ready for the next one.)
        whole_reads.clear()
        assert (await _exchange(gateway, [lean])).startswith(b"HTTP/1.1 404")
        assert whole_reads == [True], parts
    reader, writer = await asyncio.open_connection(*gateway)
    get = b"GET /v1/kv/%b/keys/p HTTP/1.1\r\nHost: x\r\n\r\n" % name.encode()
    whole_reads.clear()
    writer.write(get + get)
    answers = [await _answer(reader), await _answer(reader)]
    writer.close()
    assert True not in whole_reads
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 404 Not Found"] * 2
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


@pytest.fixture
async def slow_responder(nats_server: EmbeddedServer, name: str) -> AsyncIterator[str]:
    """A core NATS subject answered after 0.5 s."""
    nc = await nats.connect(nats_server.url)

    async def answer(msg: Any) -> None:
        await asyncio.sleep(0.5)
        await msg.respond(b"late")

    await nc.subscribe(f"slow.{name}", cb=answer)
    await nc.flush()
    try:
        yield f"slow.{name}"
    finally:
        await nc.close()


async def test_requests_sent_during_an_answer_wait_for_it(
    gateway: tuple[str, int], name: str, slow_responder: str, whole_reads: list[bool]
) -> None:
    """A client that sends its next requests before the answer (read whole) is given: they
    are read after it, answered in order."""
    slow = b"POST /v1/nats/request/%b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx" % (
        slow_responder.encode()
    )
    other = b"GET /v1/kv/%b HTTP/1.1\r\nHost: x\r\n\r\n" % name.encode()
    reader, writer = await asyncio.open_connection(*gateway)
    writer.write(slow)
    await asyncio.sleep(0.1)
    writer.write(other + slow)  # (the bucket does not exist: a 404, then the slow one again)
    answers = [await _answer(reader) for _ in range(3)]
    writer.close()
    assert whole_reads[0] is True
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 200 OK",
    ]
    assert answers[0].endswith(b"late") and answers[2].endswith(b"late")


async def test_a_client_gone_during_an_answer_leaves_the_gateway_serving(
    gateway: tuple[str, int], name: str, slow_responder: str, caplog: pytest.LogCaptureFixture
) -> None:
    slow = b"POST /v1/nats/request/%b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx" % (
        slow_responder.encode()
    )
    _, writer = await asyncio.open_connection(*gateway)
    writer.write(slow)
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.sleep(0.7)
    answer = await _exchange(gateway, [slow])
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"late")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_an_answer_in_flight_at_shutdown_is_given_then_the_connection_closes(
    nats_server: EmbeddedServer, slow_responder: str, whole_reads: list[bool]
) -> None:
    """The server exits while a request read whole waits for NATS: its answer is still
    given (with ``connection: close``), then the connection closes."""
    served = served_gateway(gateway_settings(nats_server.url))
    host, port = served.__enter__().removeprefix("http://").split(":")
    stopping = None
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/nats/request/%b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
            % slow_responder.encode()
        )
        await asyncio.sleep(0.1)
        assert whole_reads == [True]
        stopping = asyncio.get_running_loop().run_in_executor(
            None, served.__exit__, None, None, None
        )
        answer = await _answer(reader)
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        if stopping is None:
            served.__exit__(None, None, None)
    await stopping
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"late")
    assert b"\r\nconnection: close\r\n" in answer.lower()
    assert rest == b""
