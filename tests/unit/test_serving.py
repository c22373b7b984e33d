"""The gateway's HTTP protocol: a response's head leaves with what follows it, in one write;
and the process's garbage collector, tuned by ``jsgw serve`` once its app has started."""

from __future__ import annotations

import asyncio
import gc
import os
import socket as socketlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import uvloop
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from uvicorn.config import Config
from uvicorn.server import ServerState

from app import cli, main
from app.serving import (
    GC_YOUNG_THRESHOLD,
    GatheringProtocol,
    GatheringTransport,
    tune_gc_once_started,
    uvicorn_options,
)


class SocketTransport(asyncio.Transport):
    """Stands in for the socket's transport: records each write the socket would get."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.eof = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )


async def test_a_head_leaves_with_its_first_body_write_at_the_end_of_the_turn() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert socket.writes == []
    assert transport.get_write_buffer_size() == 7 + 19
    transport.write(b"body")
    assert socket.writes == []  # held to the end of the turn
    await asyncio.sleep(0)
    assert socket.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    # A further write in the turn sends what is held with it, at once.
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.writelines([b"bo", b"dy"])
    assert socket.writes[1:] == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    await asyncio.sleep(0)
    assert len(socket.writes) == 2


async def test_a_whole_answer_leaves_at_the_end_of_the_turn() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write_whole(b"HTTP/1.1 200 OK\r\n\r\none")
    assert socket.writes == []
    assert transport.get_write_buffer_size() == 7 + 22
    await asyncio.sleep(0)
    assert socket.writes == [b"HTTP/1.1 200 OK\r\n\r\none"]
    # Pipelined answers of one turn: the second sends the first with it, in order.
    transport.write_whole(b"HTTP/1.1 200 OK\r\n\r\ntwo")
    transport.write_whole(b"HTTP/1.1 200 OK\r\n\r\nthree")
    assert socket.writes[1:] == [b"HTTP/1.1 200 OK\r\n\r\ntwoHTTP/1.1 200 OK\r\n\r\nthree"]
    # After a held 100 Continue, the answer is held with it.
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    transport.write_whole(b"HTTP/1.1 200 OK\r\n\r\nfour")
    assert len(socket.writes) == 2
    await asyncio.sleep(0)
    assert socket.writes[2:] == [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nfour"]


async def test_a_head_alone_leaves_at_the_end_of_the_turn() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    assert socket.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    transport.write(b"data: 1\n\n")  # a stream's chunks go straight out
    assert socket.writes == [b"HTTP/1.1 200 OK\r\n\r\n", b"data: 1\n\n"]


async def test_one_callback_per_turn_flushes_every_held_answer(monkeypatch: Any) -> None:
    loop = asyncio.get_running_loop()
    scheduled = []
    call_soon = loop.call_soon

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(callback, "__name__", "") == "flush":
            scheduled.append(callback)
        return call_soon(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon", counting)
    sockets = [SocketTransport() for _ in range(3)]
    transports = [GatheringTransport(socket, loop) for socket in sockets]
    for transport in transports:
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transports[1].write(b"body")  # this one's head leaves with its body
    transports[2].write_whole(b"HTTP/1.1 200 OK\r\n\r\n")  # held with the head before it
    assert [socket.writes for socket in sockets] == [[], [], []]
    assert len(scheduled) == 1
    await asyncio.sleep(0)
    assert [socket.writes for socket in sockets] == [
        [b"HTTP/1.1 200 OK\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\n\r\nbody"],
        [b"HTTP/1.1 200 OK\r\n\r\n" * 2],
    ]
    transports[0].write(b"HTTP/1.1 204 No Content\r\n\r\n")  # a new turn, a new callback
    assert len(scheduled) == 2
    await asyncio.sleep(0)
    assert sockets[0].writes[1:] == [b"HTTP/1.1 204 No Content\r\n\r\n"]


async def test_close_and_eof_send_a_held_head_first() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    transport.write_eof()
    assert socket.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n"] and socket.eof
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.close()
    assert socket.writes[1:] == [b"HTTP/1.1 200 OK\r\n\r\n"] and socket.closed
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert len(socket.writes) == 2


async def test_abort_and_lost_connections_drop_a_held_head() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.abort()
    await asyncio.sleep(0)
    assert socket.writes == [] and socket.aborted

    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    socket.closed = True  # the peer went away before the turn ended
    await asyncio.sleep(0)
    assert socket.writes == []


async def test_other_calls_reach_the_socket_transport() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    assert transport.get_extra_info("peername") == ("127.0.0.1", 50000)
    assert transport.is_closing() is False


async def _serve(app: Any, request: bytes) -> SocketTransport:
    """One request through uvicorn's protocol as the gateway serves it."""
    config = Config(app, http=GatheringProtocol, lifespan="off", access_log=False)
    config.load()
    protocol = GatheringProtocol(config, ServerState(), {})
    socket = SocketTransport()
    protocol.connection_made(socket)
    protocol.data_received(request)
    for _ in range(20):
        await asyncio.sleep(0)
    return socket


async def test_a_response_leaves_in_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"5"), (b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"hello"})

    socket = await _serve(app, b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
    assert len(socket.writes) == 1
    head, _, body = socket.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 5" in head
    assert body == b"hello"
    assert not socket.closed  # kept alive


async def test_a_stream_leaves_as_it_is_written() -> None:
    step = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await step.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    socket = await _serve(app, b"GET /events HTTP/1.1\r\nhost: t\r\n\r\n")
    # The head and the first event were written in the same turn: one write.
    assert len(socket.writes) == 1 and socket.writes[0].endswith(b"9\r\ndata: 1\n\n\r\n")
    step.set()
    for _ in range(10):
        await asyncio.sleep(0)
    # Later chunks each as they are written, as uvicorn writes them.
    assert socket.writes[1:] == [b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]


async def test_a_refused_request_is_answered_before_the_close() -> None:
    socket = await _serve(lambda *_: None, b"NOT HTTP AT ALL\r\n\r\n")
    assert socket.closed
    assert len(socket.writes) == 1 and socket.writes[0].startswith(b"HTTP/1.1 400 ")


def test_held_writes_do_not_keep_their_loop_alive() -> None:
    import gc
    import weakref

    loop = asyncio.new_event_loop()

    async def respond() -> None:
        transport = GatheringTransport(SocketTransport(), asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        await asyncio.sleep(0)

    loop.run_until_complete(respond())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as a process starts with it (nothing frozen, Python's thresholds), and
    as it was afterwards."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, *thresholds[1:])
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def _app(seen: list[tuple[int, int]]) -> Starlette:
    """An app whose start-up records the collector's young threshold and frozen count."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[dict[str, str]]:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        yield {"started": "yes"}

    return Starlette(lifespan=lifespan)


def _tuned() -> bool:
    return gc.get_threshold()[0] == GC_YOUNG_THRESHOLD and gc.get_freeze_count() > 0


async def test_the_collector_is_tuned_once_the_app_has_started(collector: None) -> None:
    seen: list[tuple[int, int]] = []
    app = tune_gc_once_started(_app(seen))
    assert not _tuned()
    async with LifespanManager(app) as manager:
        # After the app's start-up, so that what it made is frozen with it.
        assert seen == [(700, 0)] and _tuned()
        assert manager._state == {"started": "yes"}  # the app's state still reaches it


async def test_every_worker_tunes_its_own_collector(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jsgw serve`` hands uvicorn the factory by name: with JSGW_WORKERS > 1 every spawned
    worker imports and calls it, and so tunes its own collector once its app has started."""
    passed: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: passed.update(app=app, **options))
    monkeypatch.setenv("JSGW_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("JSGW_WORKERS", "2")
    monkeypatch.setenv("JSGW_ACK_SECRET", "s" * 32)
    assert cli.main(["serve"]) == 0
    assert passed["app"] == "app.cli:app_from_env" and passed["factory"] is True
    assert passed["workers"] == 2
    assert not _tuned()  # not by the supervisor: it serves nothing

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(main, "create_app", lambda settings: _app(seen))
    async with LifespanManager(cli.app_from_env()):
        assert seen == [(700, 0)] and _tuned()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_owns_the_metrics_directory_of_its_workers(
    workers: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With several workers: a new, empty directory named in PROMETHEUS_MULTIPROC_DIR while
    they run, removed (and the variable with it) at exit; with one, none. An inherited
    value is not used either way."""
    seen: dict[str, Any] = {}

    def run(app: str, **options: Any) -> None:
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        seen["dir"] = path
        seen["contents"] = os.listdir(path) if path else None

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.setenv("JSGW_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("JSGW_WORKERS", str(workers))
    monkeypatch.setenv("JSGW_ACK_SECRET", "s" * 32)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert cli.main(["serve"]) == 0
    if workers == 1:
        assert seen["dir"] is None
    else:
        assert seen["dir"] != str(tmp_path) and Path(seen["dir"]).parent == tmp_path / "tmp"
        assert seen["contents"] == []
        assert not Path(seen["dir"]).exists()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


async def test_a_pipelined_head_after_a_large_body_is_not_taken_for_a_large_head() -> None:
    """A read that ends one head, carries its body and begins the next request's head is the
    new head's first read: its bytes are not counted against the new head's bound."""
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ok(request: Request) -> PlainTextResponse:
        await request.body()
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/x", ok, methods=["GET", "POST"])])
    config = Config(app, http=GatheringProtocol, lifespan="off", access_log=False)
    config.load()
    protocol = GatheringProtocol(config, ServerState(), {})
    transport = SocketTransport()
    protocol.connection_made(transport)
    protocol._max_head_bytes, protocol._max_head_fields = 8192, 100
    body = b"a" * 20_000
    first = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    second = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
    protocol.data_received(first[:10])  # the first head, incomplete
    protocol.data_received(first[10:] + second[:8])  # its rest and body, the next head begun
    for _ in range(50):
        await asyncio.sleep(0)
    protocol.data_received(second[8:])
    for _ in range(50):
        await asyncio.sleep(0)
    answers = b"".join(transport.writes)
    assert answers.count(b"HTTP/1.1 200 OK") == 2, answers[:300]
    assert b"431" not in answers
    protocol.connection_lost(None)


async def test_a_connection_s_dict_still_shares_its_keys_with_the_class() -> None:
    """The protocol's own state is in slots: in the instance's dict, uvicorn's 27 attributes
    and ours went past the 30 keys an instance shares with its class, and every connection
    (every open SSE stream) held a dict of 1.6 KB instead of 0.3. A uvicorn that sets more
    attributes of its own fails here, so that its cost per connection is seen."""
    import sys
    from types import SimpleNamespace

    settings = SimpleNamespace(
        max_connections=100,
        header_timeout=5.0,
        max_header_bytes=8192,
        max_header_fields=100,
        max_body=1 << 20,
    )
    started = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        started.set()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    config = Config(app, http=GatheringProtocol, lifespan="off", access_log=False)
    config.load()
    alone = GatheringProtocol(config, ServerState(), {})
    alone.connection_made(SocketTransport())
    protocol = GatheringProtocol(
        config, ServerState(), {"runtime": SimpleNamespace(settings=settings)}
    )
    protocol.connection_made(SocketTransport())
    protocol.data_received(b"GET /v1/kv/b/watch HTTP/1.1\r\nHost: h\r\n\r\n")
    await asyncio.wait_for(started.wait(), 5)
    assert len(vars(protocol)) <= 30, sorted(vars(protocol))
    # (A dict that shares its keys holds only its values: the size of the one of a protocol
    # that has seen no request and no settings.)
    assert sys.getsizeof(vars(protocol)) == sys.getsizeof(vars(alone))
    protocol.connection_lost(None)
    alone.connection_lost(None)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_answer_reaches_a_client_that_half_closed_after_its_request(loop: str) -> None:
    """A client may send its request and then its FIN (``shutdown(SHUT_WR)``); uvicorn's
    protocol lets the socket's transport close itself on that FIN, past the gathering one: an
    answer made before the connection is lost still leaves, as with uvicorn's own transport.
    (One made later is not sent by uvicorn at all: it sees a disconnect.) asyncio reads the
    FIN in a later turn than the request, once the answer is held; uvloop reads both at once,
    and the transport is closing before the answer is made."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send(
            {"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"no"})

    async def scenario() -> list[bytes]:
        listener = socketlib.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        options = {**uvicorn_options(), "loop": "none"}  # (the running loop)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **options))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            answers = []
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                writer.write_eof()
                answers.append((await asyncio.wait_for(reader.read(), 5))[:12])
                writer.close()
            return answers
        finally:
            server.should_exit = True
            await serving

    run = uvloop.run if loop == "uvloop" else asyncio.run
    assert run(scenario()) == [b"HTTP/1.1 401"] * 20


async def test_a_transport_closing_on_its_own_takes_an_answer_at_once() -> None:
    socket = SocketTransport()
    transport = GatheringTransport(socket, asyncio.get_running_loop())
    socket.is_closing = lambda: True  # type: ignore[method-assign]  # (the client's FIN)
    transport.write_whole(b"HTTP/1.1 401 Unauthorized\r\n\r\n")
    assert socket.writes == [b"HTTP/1.1 401 Unauthorized\r\n\r\n"]


async def test_a_held_answer_that_cannot_be_sent_ends_its_connection() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    broken, fine = SocketTransport(), SocketTransport()

    def refuse(data: Any) -> None:
        raise RuntimeError("unable to perform operation")

    broken.write = refuse  # type: ignore[method-assign]
    for socket in (broken, fine):
        GatheringTransport(socket, loop).write_whole(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    assert broken.aborted and fine.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    assert [context["message"] for context in errors] == ["flushing a held response failed"]
    loop.set_exception_handler(None)
