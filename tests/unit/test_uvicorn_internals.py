"""What the gateway relies on inside uvicorn, beyond its public API.

``app.serving.GatheringProtocol`` subclasses uvicorn's ``HttpToolsProtocol`` (and
``app.tls.ClientCertProtocol`` subclasses it in turn): it swaps the transport uvicorn writes to,
relies on uvicorn writing a response's head in one write, overrides ``connection_made``,
``resume_writing``, ``shutdown`` and ``connection_lost``, and reads the protocol's ``loop``,
``flow`` (``write_paused``) and ``transport``; ``ClientCertProtocol`` overrides
``on_message_begin`` and writes into ``scope``. ``app.sse.server_exiting`` finds uvicorn's
``Server`` through the SIGTERM handler it installs and reads its ``should_exit``.
app/compat.py lists each of these and checks, at start-up and here, that they still exist in
the form relied on; these tests drive a connection through uvicorn's protocol to see what only
running it shows. pyproject.toml pins uvicorn to the release series these were written and
tested against: when an upgrade moves or changes one of them, a test fails saying which one
and how, and widening the pin is then a decision (re-read those modules against the new
release), not a surprise in production.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import pytest
from uvicorn.config import LOOP_FACTORIES, Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.server import Server, ServerState

from app import serving
from app.compat import UVICORN, SseAppStatus
from app.serving import _HEAD, GatheringProtocol, GatheringTransport, uvicorn_options
from app.sse import server_exiting
from app.tls import ClientCertProtocol
from tests.unit.pinned import Pinned

PINNED = Pinned(UVICORN, "app/serving.py, tls.py, sse.py")
_require = PINNED.require


class _Socket(asyncio.Transport):
    """Stands in for a connection's socket transport: records what uvicorn does to it."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False
        self.extra = {"peername": ("127.0.0.1", 50000), **(extra or {})}

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


def _protocol(app: Any, cls: type[Any] = GatheringProtocol) -> Any:
    config = Config(app, http=cls, lifespan="off", access_log=False, log_config=None)
    config.load()
    return cls(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )


async def _turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_the_installed_release_is_the_tested_one() -> None:
    PINNED.in_tested_series()


def test_nothing_the_gateway_relies_on_moved() -> None:
    """app.compat's list of uvicorn's private names: each one still there, as relied on."""
    PINNED.nothing_moved()


def test_the_protocol_class() -> None:
    base = httptools_impl.HttpToolsProtocol
    _require(issubclass(base, asyncio.Protocol), "HttpToolsProtocol", "is not an asyncio.Protocol")
    _require(
        GatheringProtocol.__bases__ == (base,),
        "HttpToolsProtocol",
        "is not the class app.serving.GatheringProtocol subclasses",
    )


async def test_protocol_attributes() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    protocol = _protocol(app)
    loop = getattr(protocol, "loop", None)
    _require(
        loop is asyncio.get_running_loop(),
        "HttpToolsProtocol.loop",
        "is not the event loop it was made on",
    )
    socket = _Socket()
    protocol.connection_made(socket)
    transport = getattr(protocol, "transport", None)
    _require(
        isinstance(transport, GatheringTransport),
        "HttpToolsProtocol.transport",
        "is not the transport connection_made was given",
    )
    flow = getattr(protocol, "flow", None)
    _require(isinstance(flow, FlowControl), "HttpToolsProtocol.flow", "is not a FlowControl")
    _require(
        getattr(flow, "_transport", None) is transport,
        "HttpToolsProtocol.flow",
        "does not control the transport connection_made was given",
    )
    _require(
        getattr(flow, "write_paused", None) is False,
        "FlowControl.write_paused",
        "is not False on a new connection",
    )
    _require(
        protocol in protocol.server_state.connections,
        "ServerState.connections",
        "does not hold a made connection",
    )
    protocol.pause_writing()
    _require(
        flow.write_paused is True,
        "HttpToolsProtocol.pause_writing",
        "does not set FlowControl.write_paused",
    )
    protocol.resume_writing()
    _require(
        flow.write_paused is False,
        "HttpToolsProtocol.resume_writing",
        "does not clear FlowControl.write_paused",
    )
    protocol.shutdown()  # idle: closed at once
    _require(
        socket.closed,
        "HttpToolsProtocol.shutdown",
        "does not close an idle connection through HttpToolsProtocol.transport",
    )
    protocol.connection_lost(None)
    _require(
        protocol not in protocol.server_state.connections,
        "ServerState.connections",
        "still holds a lost connection",
    )


async def test_a_response_head_is_one_write_of_its_own() -> None:
    """GatheringTransport holds a write that begins with ``HTTP/`` as a response's head."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    socket = _Socket()
    protocol = _protocol(app, httptools_impl.HttpToolsProtocol)  # uvicorn's own, unwrapped
    protocol.connection_made(socket)
    protocol.data_received(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
    await _turns()
    _require(
        len(socket.writes) == 3,
        "RequestResponseCycle.send",
        f"wrote a head and two chunks in {len(socket.writes)} writes, not 3",
    )
    head = socket.writes[0]
    _require(
        head.startswith(_HEAD) and head.endswith(b"\r\n\r\n") and b"data" not in head,
        "RequestResponseCycle.send",
        f"no longer writes the status line and headers alone, starting {_HEAD!r}: {head!r}",
    )
    _require(
        not any(w.startswith(_HEAD) for w in socket.writes[1:]),
        "RequestResponseCycle.send",
        "writes body chunks that look like a head",
    )


async def test_a_lost_connection_wakes_a_paused_writer() -> None:
    """What GatheringProtocol's cut of a stalled connection depends on: a shut-down connection
    with a response in flight stays open, and losing it ends the request's paused send."""
    written, go = asyncio.Event(), asyncio.Event()
    outcome: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        written.set()
        await go.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        outcome.append("send returned")
        outcome.append((await receive())["type"])

    socket = _Socket()
    protocol = _protocol(app)
    protocol.connection_made(socket)
    protocol.data_received(b"GET /events HTTP/1.1\r\nhost: t\r\n\r\n")
    await _turns()
    _require(written.is_set(), "RequestResponseCycle.send", "did not write the first event")
    protocol.pause_writing()  # the client now reads nothing
    go.set()
    await _turns()
    _require(
        not outcome,
        "RequestResponseCycle.send",
        "does not wait for the drain while HttpToolsProtocol.flow.write_paused",
    )
    protocol.shutdown()
    try:
        cycle = getattr(protocol, "cycle", None)
        _require(
            not socket.closed and cycle is not None and cycle.keep_alive is False,
            "HttpToolsProtocol.shutdown",
            "does not leave a connection with a response in flight open",
        )
        protocol.transport.abort()  # as GatheringProtocol._cut_if_stalled does
        _require(socket.aborted, "HttpToolsProtocol.transport", "abort does not reach the socket")
        protocol.connection_lost(None)  # what a real transport calls after abort
        await _turns()
        _require(
            outcome == ["send returned", "http.disconnect"],
            "HttpToolsProtocol.connection_lost",
            f"does not wake the paused send and report a disconnect ({outcome})",
        )
        _require(
            protocol.flow.write_paused is False,
            "HttpToolsProtocol.connection_lost",
            "leaves FlowControl.write_paused set",
        )
    finally:
        check = protocol._stall_check
        if check is not None:
            check.cancel()


async def test_a_stalled_connection_is_cut_on_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """GatheringProtocol's whole use of ``shutdown``, ``loop``, ``flow`` and ``transport``."""
    monkeypatch.setattr(serving, "STALL_GRACE", 0.01)
    stalled = asyncio.Event()

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        stalled.set()
        await receive()  # until the connection goes

    socket = _Socket()
    protocol = _protocol(handler)
    protocol.connection_made(socket)
    protocol.data_received(b"GET /events HTTP/1.1\r\nhost: t\r\n\r\n")
    await asyncio.wait_for(stalled.wait(), 5)
    protocol.pause_writing()  # the client now reads nothing
    protocol.shutdown()
    await asyncio.sleep(0.1)
    _require(
        socket.aborted,
        "HttpToolsProtocol.shutdown/flow/transport",
        "no longer let GatheringProtocol cut a connection whose writes stay paused",
    )
    protocol.connection_lost(None)
    await _turns()


async def test_client_cert_name_reaches_the_scope() -> None:
    """app.tls.ClientCertProtocol: ``on_message_begin`` makes ``scope``, the app gets it."""
    scopes: list[Any] = []

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class SSLObject:
        def getpeercert(self) -> dict[str, Any]:
            return {"subject": ((("commonName", "orders"),),)}

    protocol = _protocol(handler, ClientCertProtocol)
    protocol.connection_made(_Socket({"ssl_object": SSLObject()}))
    protocol.data_received(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
    await _turns()
    tls = scopes[0].get("extensions", {}).get("tls") if scopes else None
    _require(
        tls == {"client_cert_name": "CN=orders"},
        "HttpToolsProtocol.scope",
        f"made in on_message_begin is not the scope the app gets ({tls})",
    )
    protocol.connection_lost(None)


def test_the_exit_flag_server_exiting_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """app.sse.server_exiting: uvicorn's SIGTERM handler is a method of its Server, whose
    ``should_exit`` says it is exiting."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    monkeypatch.setattr(SseAppStatus, "should_exit", False)  # (set by sse-starlette's patch below)

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        pass

    server = Server(Config(handler, log_config=None))
    _require(
        getattr(server, "should_exit", None) is False,
        "Server.should_exit",
        "is not False on a new server",
    )
    with server.capture_signals():
        installed = signal.getsignal(signal.SIGTERM)
        _require(
            getattr(installed, "__self__", None) is server,
            "Server.capture_signals",
            "no longer installs a method of the server as the SIGTERM handler",
        )
        _require(not server_exiting(), "Server.should_exit", "reads as exiting before a signal")
        server.should_exit = True
        exiting = server_exiting()
        server.should_exit = False
        _require(exiting, "Server.should_exit", "is not found through the SIGTERM handler")
    server.handle_exit(signal.SIGTERM, None)  # outside capture_signals: nothing re-raised
    _require(
        server.should_exit is True, "Server.handle_exit", "does not set should_exit on SIGTERM"
    )


def test_the_options_the_gateway_passes() -> None:
    """``jsgw serve`` (app.cli) and the tests' real server pass these to uvicorn (app.compat
    checks the names are accepted)."""
    options = uvicorn_options()
    _require(
        options["loop"] in LOOP_FACTORIES,
        f"Config(loop={options['loop']!r})",
        "is not a loop uvicorn knows",
    )

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        pass

    config = Config(handler, lifespan="off", log_config=None, **options)
    config.load()
    _require(
        config.http_protocol_class is GatheringProtocol,
        "Config(http=<a class>)",
        "does not serve with the class given",
    )
