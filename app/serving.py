"""The HTTP protocol the gateway serves with: uvicorn's httptools protocol, one write per answer.

uvicorn writes a response's status line and headers, then each body chunk, straight to the
socket: two ``send`` system calls (and, on the client's side, two segments to read) for the
smallest answer. A KV GET is small and frequent, so those calls were a fifth of its CPU time.
Here the transport uvicorn writes to holds a response's head and its first body write (or a
whole answer, :meth:`GatheringTransport.write_whole`, as the lean paths write them) until the
end of the event loop's turn, and sends them in one write; one callback per turn flushes every
connection's held answer, not one per response (scheduled with ``call_soon``: it runs after
the callbacks already due, and after the I/O the loop reads before it gets to them). A
further write on the connection in the same turn sends what is held with it at once, so what
is held is at most an answer and a head, and a stream's later chunks (SSE, NDJSON) go
straight to the socket: not delayed, which matters when one change is written to thousands
of watchers. Closing the connection sends what is held first; so does the client's FIN, on
which uvicorn lets the socket's transport close on its own (and while that transport is
closing, writes go to it at once: it still sends them before the connection is lost).

Why the end of the turn, not at once: the answers finished in one turn (those whose NATS
replies came in one read) then leave in one burst. Each write to a client waiting for data
wakes it, and waking a process that sleeps in ``epoll_wait`` is kernel work done in the
writer's system call, paid once per burst instead of once per answer. With wrk's 64
connections on the other core, sending at once woke wrk at every KV GET (14,000 wake-ups a
second at 14,000 requests a second, ``perf stat -e sched:sched_waking``), and the gateway
spent 16 µs of system time per request; held to the end of the turn, one wake-up per 9
requests and 7 to 8 µs. An answer waits at most for the rest of its turn. At 64 connections
latency fell with the CPU saved; at 1 and 8 the medians moved within the runs' noise (one run
each, docs/performance.md).

When the server begins to exit, a connection whose client has stopped reading (its socket
buffers full, writes paused) is cut once it has taken nothing for ``STALL_GRACE`` seconds:
closing it would wait for a flush that never comes, and uvicorn waits for every connection
to go before it stops (until its ``timeout_graceful_shutdown``, then cancelling everything
with a traceback per request). Streams end with a farewell event on shutdown; to a client
that reads nothing the farewell cannot be delivered anyway. Besides ``connection_made``,
this uses the protocol's ``shutdown``, ``resume_writing``, ``connection_lost``, ``loop``,
``flow`` (``write_paused``) and ``transport`` (app/compat.py checks them at start-up).

A read that holds one whole request of a lean path whose answers are written whole (the
commonest read under load: a KV GET, a publish with its small body), on a connection with
nothing in flight, is not handed to uvicorn's parser: a parser of the protocol's own
(:class:`_WholeReader`: the same llhttp, its callbacks only gathering) reads it, the scope is
made as uvicorn's callbacks make it, and :class:`app.fastpath.DirectPaths` answers it through a
:class:`WholeCycle` (the part of uvicorn's request/response cycle it reads). uvicorn's
per-request work (its callbacks, the cycle and its event, the overrides above) cost about a
tenth of a KV GET. Anything else goes to uvicorn's parser as before: a head or body cut across
reads, two requests in one read, an ``Expect`` or ``Upgrade`` header, a head over its bounds
(refused there), another route, a streamed answer, any read the parser refuses (uvicorn
answers it). While such a request is answered, what the client sends next waits, unparsed,
and is read after the answer (reading pauses past ``_WAITING_HIGH``); at shutdown the answer
is given with ``connection: close``. tests/integration/test_whole_reads.py sends each kind of
request both ways on a real socket and compares the answers and the scopes; app/compat.py
checks the parts of uvicorn's callbacks this repeats.

The garbage collector is tuned for serving (:func:`tune_gc_once_started`) by the process that
serves, once its app has started: the setting is the process's, not an app's.

Clients that hold connections without finishing requests are bounded here too, since uvicorn
bounds only the idle time after an answer (``timeout_keep_alive``): a connection must
complete its request head within ``JSGW_HEADER_TIMEOUT`` of opening, and each later head
within that time of its first byte, or it is closed (a client that connects and sends
nothing, or sends its headers a byte at a time). A complete head ends the bound, so SSE
streams and slow uploads go on. Past ``JSGW_MAX_CONNECTIONS`` open connections (kept below
the process's descriptor limit, which ``jsgw serve`` raises to its hard limit at start) a new
connection gets a 503 problem with ``Retry-After`` and is closed before anything is read.

Request heads are bounded in size too, before anything else (authentication included) looks at
them: past ``JSGW_MAX_HEADER_BYTES`` (the request line and header lines, counted as the
parser hands them over, and as bytes received while a head is incomplete, so that a 64 MiB
header line is refused after about the limit instead of being gathered whole by the parser)
or ``JSGW_MAX_HEADER_FIELDS`` fields, the request gets a 431 problem and the connection is
closed. The parser is stopped by raising from its callback (``on_url``, ``on_header``,
``on_headers_complete``); uvicorn then answers an invalid request through
``send_400_response``, which answers the 431 instead. A refused connection reads and drops
what its client still sends for at most ``REFUSAL_LINGER`` seconds and ``REFUSAL_DRAIN``
bytes before it closes, so that the answer is not lost to a reset while staying bounded.
The limits come from the app's settings in the lifespan state (``app_state["runtime"]``);
the head bound is armed at connection and otherwise only when bytes arrive on an idle
connection and leave it without a request, so a request on a kept-alive connection pays a few
comparisons. This uses ``app_state``, ``connections``, ``cycle`` (``response_complete``),
``pipeline``, ``timeout_keep_alive_task``, ``data_received`` and ``on_headers_complete`` of
uvicorn's protocol.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import resource
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httptools
import orjson
from starlette.applications import Starlette

from app.compat import HttpToolsProtocol
from app.errors import ErrorCode, HeadTooLarge, Unavailable

log = logging.getLogger("jsgw.serving")

_HEAD = b"HTTP/"  # how uvicorn's status lines begin
# The lifespan state's key of the lean paths served from the protocol (app.fastpath).
DIRECT_PATHS = "direct_paths"
# Once the server exits: how long a connection with paused writes may take nothing.
STALL_GRACE = 2.0
GC_YOUNG_THRESHOLD = 10_000
# Descriptors kept for what is not a client connection: NATS connections, the listener,
# log files, the embedded server's pipes.
DESCRIPTOR_RESERVE = 64
# How long, and how much, a refused connection (past the connection cap, or a head over its
# bounds) reads and drops before it closes.
REFUSAL_LINGER = 1.0
REFUSAL_DRAIN = 256 * 1024
# What a request line adds to its target's length: method, spaces, version, CRLF.
_REQUEST_LINE = 24
# What a header line adds to its name and value: ": " and CRLF.
_HEADER_LINE = 4
# What may wait, unread by the parser, while a request read whole is answered (a client that
# sends its next requests before the answer): past it, reading pauses until the answer.
_WAITING_HIGH = 64 * 1024


class _NotWhole(Exception):
    """A read that holds no request whole, or more than one."""


class _HeadRefused(Exception):
    """Raised from a parser callback to stop the parser at a head over its bounds."""


class HeldWrites:
    """The transports of one event loop holding an answer or a head: flushed together at the
    end of the loop's turn."""

    __slots__ = ("_loop", "transports")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # (held weakly: the registry below is keyed by it)
        self.transports: list[GatheringTransport] = []

    def add(self, transport: GatheringTransport) -> None:
        if not self.transports:
            # (The loop is alive: the socket's transport, held by ``transport``, refers to it.)
            self._loop().call_soon(self.flush)  # type: ignore[union-attr]
        self.transports.append(transport)

    def flush(self) -> None:
        transports, self.transports = self.transports, []
        for transport in transports:
            try:
                transport.flush()
            except Exception as exc:  # noqa: BLE001 - one broken socket must not hold the others
                # Its answer is lost: the connection goes, so that no later answer on it is
                # taken for this one.
                transport.abort()
                self._loop().call_exception_handler(  # type: ignore[union-attr]
                    {"message": "flushing a held response failed", "exception": exc}
                )


_HELD: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HeldWrites] = (
    weakref.WeakKeyDictionary()
)


def _held_writes(loop: asyncio.AbstractEventLoop) -> HeldWrites:
    held = _HELD.get(loop)
    if held is None:
        held = _HELD[loop] = HeldWrites(loop)
    return held


_READERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WholeReader] = (
    weakref.WeakKeyDictionary()
)


def _whole_reader(loop: asyncio.AbstractEventLoop) -> _WholeReader:
    """The loop's reader of requests read whole: one for all its connections (about 1 KB
    each otherwise, an SSE stream's tenth), as a read is parsed in one call, and each call
    leaves the parser at a request's start (or a new one)."""
    reader = _READERS.get(loop)
    if reader is None:
        reader = _READERS[loop] = _WholeReader()
    return reader


class GatheringTransport:
    """An ``asyncio.Transport`` that sends a response's head together with what follows it,
    at the end of the loop's turn (see the module's docstring)."""

    __slots__ = ("_held", "_linger", "_pending", "_transport", "_whole")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        linger: Callable[[], bool] | None = None,
    ) -> None:
        self._transport = transport
        self._held = _held_writes(loop)
        self._pending: bytes | None = None  # held until the end of the turn
        self._whole = False  # what is held is an answer (not a head alone)
        # Asked first on close: True when the protocol closes later itself (a request body
        # still arriving is read and dropped a while, so the answer is not lost to a reset).
        self._linger = linger

    def write(self, data: bytes) -> None:
        if self._pending is None and not data.startswith(_HEAD):
            self._transport.write(data)  # a stream's later chunks: straight out
        else:
            # (A body that happens to start so is only held as a head is: never reordered.)
            self._gather(data, whole=False)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def write_whole(self, data: bytes) -> None:
        """A whole answer, head and body: held as a head with its first body write is."""
        self._gather(data, whole=True)

    def _gather(self, data: bytes, whole: bool) -> None:
        pending = self._pending
        if self._transport.is_closing():
            # (Closing on its own: the client's FIN, on which uvicorn's protocol lets the
            # socket's transport close. It still sends what it is given before it goes.)
            self._pending = None
            self._transport.write(data if pending is None else pending + data)
        elif pending is None:
            self._pending = bytes(data)
            self._whole = whole
            self._held.add(self)
        elif self._whole:  # an answer is held already: it leaves now, with this
            self._pending = None
            self._transport.write(pending + data)
        else:  # a head: held on with its first body write
            self._pending = pending + data
            self._whole = True

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not self._transport.is_closing():
            self._transport.write(pending)

    def close(self) -> None:
        self.flush()
        if self._linger is None or not self._linger():
            self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        pending = self._pending
        return self._transport.get_write_buffer_size() + (len(pending) if pending else 0)

    def is_closing(self) -> bool:
        # (Asked a few times per request: not through __getattr__'s lookup.)
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _declared_length(scope: Mapping[str, Any]) -> int:
    """A request's Content-Length (0: none, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() and len(value) < 19 else 0
    return 0


class _WholeReader:
    """The parser callbacks of requests read whole (:meth:`GatheringProtocol._serve_whole`):
    a request's target, header fields and body, and what its head's bounds count."""

    __slots__ = (
        "begun",
        "body",
        "complete",
        "expect",
        "head_bytes",
        "headers",
        "keep_alive",
        "method",
        "parser",
        "upgrade",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.begun = 0  # messages begun in this read
        self.complete = False
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.expect = self.keep_alive = self.upgrade = False
        self.head_bytes = 0
        self.version = ""
        self.method = b""

    def reset(self) -> None:
        """A new parser, for a read that left this one inside a request."""
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.begun += 1
        self.url = self.body = b""
        self.headers = []
        self.head_bytes = _REQUEST_LINE

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect":
            self.expect = True
        self.headers.append((name, value))
        self.head_bytes += len(name) + len(value) + _HEADER_LINE

    def on_headers_complete(self) -> None:
        # (Read now, as uvicorn's on_headers_complete reads them: past the message's end, the
        # parser has moved on.)
        parser = self.parser
        self.version = parser.get_http_version()
        self.method = parser.get_method()
        self.keep_alive = self.version != "1.0" and parser.should_keep_alive()
        self.upgrade = parser.should_upgrade()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class _Wakeup:
    """``message_event`` of a :class:`WholeCycle`: wakes a ``receive`` waiting for the end."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None] | None = None) -> None:
        self.future = future

    def set(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(None)


_NO_WAITER = _Wakeup()


class WholeCycle:
    """A request read whole in one read, as app.fastpath.DirectPaths answers it: what it
    reads of uvicorn's ``RequestResponseCycle``, with the body in hand and the answer written
    whole (routes whose answers stream are never read this way)."""

    __slots__ = (
        "body",
        "default_headers",
        "disconnected",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self, scope: dict[str, Any], body: bytes, protocol: GatheringProtocol, keep_alive: bool
    ) -> None:
        self.scope = scope
        self.body: bytes | None = body
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.default_headers = protocol.server_state.default_headers
        self.keep_alive = keep_alive
        self.on_response = protocol._whole_answered
        self.message_event = _NO_WAITER
        self.disconnected = False
        self.more_body = False
        self.response_started = False
        self.response_complete = False
        self.waiting_for_100_continue = False

    async def receive(self) -> dict[str, Any]:
        """As uvicorn's: the body, then (once the answer is done or the client gone) the end."""
        if self.body is not None and not self.disconnected and not self.response_complete:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.disconnected and not self.response_complete:
            waiter = self.message_event = _Wakeup(asyncio.get_running_loop().create_future())
            await waiter.future  # type: ignore[misc]
        return {"type": "http.disconnect"}

    async def send(self, message: Mapping[str, Any]) -> None:
        raise RuntimeError("an answer to a request read whole is written whole")

    async def send_500_response(self) -> None:
        """uvicorn's answer to a request whose answer failed before it began, as its ``send``
        writes it: nothing to a client gone, no body to a HEAD, the connection closed."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        head = [b"HTTP/1.1 500 Internal Server Error\r\n"]
        for name, value in self.default_headers:
            head += (name, b": ", value, b"\r\n")
        head.append(
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
            b"connection: close\r\n\r\n"
        )
        if self.scope["method"] != "HEAD":
            head.append(b"Internal Server Error")
        self.response_started = self.response_complete = True
        self.keep_alive = False
        self.transport.write(b"".join(head))
        self.message_event.set()
        self.transport.close()
        self.on_response()


class GatheringProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a ``GatheringTransport``; on shutdown it
    cuts a connection whose client reads nothing."""

    # Slots, not the instance's dict: uvicorn's protocol sets 27 attributes, and past 30 an
    # instance's dict no longer shares its keys with the class's other instances (1.6 KB per
    # connection instead of 0.3: a tenth of an open SSE stream's memory).
    __slots__ = (
        "_answering",
        "_direct",
        "_drain",
        "_head_bytes",
        "_head_deadline",
        "_head_fields",
        "_head_received",
        "_head_refusal",
        "_header_timeout",
        "_heads_begun",
        "_idle_since",
        "_idle_timer",
        "_in_body",
        "_in_head",
        "_max_body",
        "_max_head_bytes",
        "_max_head_fields",
        "_refused",
        "_resumed_at",
        "_stall_check",
        "_waiting",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stall_check: asyncio.TimerHandle | None = None
        self._resumed_at = 0.0  # when the transport last took writes again
        self._header_timeout = 0.0  # 0: no bound (no settings in the lifespan state)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._refused: asyncio.TimerHandle | None = None  # the close of a refused connection
        self._drain = 0  # what a refused connection may still read and drop
        self._max_head_bytes = 0  # 0: no bound (no settings in the lifespan state)
        self._max_head_fields = 0
        self._in_head = False  # a request head has begun and is not complete
        self._head_bytes = 0  # its size so far: the request target and the header lines
        self._head_received = 0  # bytes received since the read in which it began
        self._heads_begun = 0  # request heads begun on this connection
        self._head_fields = 0
        self._head_refusal: ErrorCode | None = None  # why the parser was stopped
        self._direct: Any = None  # app.fastpath.DirectPaths, from the lifespan state
        self._in_body = False  # a request's head is complete and its body still arriving
        self._max_body = 0  # JSGW_MAX_BODY (0: no settings in the lifespan state)
        # Requests read whole (:meth:`_serve_whole`; None: not read so on this server): the
        # reader (the loop's), the request being answered, and what came meanwhile.
        self._whole: _WholeReader | None = None
        self._answering: WholeCycle | None = None
        self._waiting = b""
        # The keep-alive bound after a request read whole: idle since (0.0: not idle), and
        # one timer that looks again when it fires (not one armed and cancelled per request).
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        gathering = GatheringTransport(transport, self.loop, self._linger_on_close)
        super().connection_made(gathering)  # type: ignore[arg-type]
        runtime = self.app_state.get("runtime")
        if runtime is None:
            return
        self._direct = self.app_state.get(DIRECT_PATHS)
        if self._direct is not None and self.limit_concurrency is None:
            self._whole = _whole_reader(self.loop)
        settings = runtime.settings
        self._max_body = settings.max_body
        if len(self.connections) > connection_cap(settings.max_connections):
            self._refuse(settings.retry_after)
            return
        self._header_timeout = settings.header_timeout
        self._max_head_bytes = settings.max_header_bytes
        self._max_head_fields = settings.max_header_fields
        self._head_deadline = self.loop.call_later(self._header_timeout, self._head_too_slow)

    def _refuse(self, retry_after: int) -> None:
        """Answer 503 and close, gently (see :meth:`_answer_and_close`)."""
        body = _busy_body()
        head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n"
            b"retry-after: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (retry_after, len(body))
        )
        self._answer_and_close(head + body)

    def _answer_and_close(self, answer: bytes) -> None:
        """Write ``answer`` and close, gently: what the client sent before it reads is read
        and dropped for a moment (``REFUSAL_LINGER``, at most ``REFUSAL_DRAIN`` bytes), so that
        the close does not reset the connection (a reset would lose the answer before the
        client reads it); a client still sending past that is cut."""
        self.transport.write(answer)
        if self.transport.can_write_eof():  # (TLS transports cannot half-close)
            self.transport.write_eof()
        self._drain = REFUSAL_DRAIN
        self._refused = self.loop.call_later(REFUSAL_LINGER, self.transport.close)

    def data_received(self, data: bytes) -> None:
        self._idle_since = 0.0
        if self._answering is not None:  # (a request read whole is being answered)
            self._waiting += data
            if len(self._waiting) > _WAITING_HIGH:
                self.flow.pause_reading()
            return
        if (
            self._whole is not None
            and self._refused is None
            and not self._in_head
            and not self._in_body
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and self._serve_whole(data)
        ):
            return
        if self._refused is not None:  # a refused connection's request: dropped
            self._drain -= len(data)
            if self._drain < 0 and not self.transport.is_closing():
                self.transport.close()
            return
        continuing, begun = self._in_head, self._heads_begun
        super().data_received(data)
        if self._refusing():
            return  # a head over its bounds, refused by the parser's callbacks
        if self._in_head and self._max_head_bytes:
            # A head still incomplete: the bytes that arrived after the read in which it began
            # are all its own (that read is bounded by the size of a read, and what the parser
            # handed over of it is counted by the callbacks): either count is at most the
            # head's size, and the parser never gathers much more than the bound. A read that
            # ended one head and began another (pipelining: the rest of a head, a body, more
            # requests, then a new head's start) is that new head's first read.
            if continuing and self._heads_begun == begun:
                self._head_received += len(data)
            if max(self._head_received, self._head_bytes) > self._max_head_bytes:
                self._refuse_head(ErrorCode.HEADER_TOO_LARGE)
                return
        # Bytes that leave the connection idle (uvicorn's keep-alive bound just cancelled,
        # no request in flight): a head cut across reads, or bytes that are no request (CR/LF
        # between requests), must come to a complete head in time. While a response is in
        # flight or pipelined requests wait the server is the one not reading: no bound then.
        if (
            self._head_deadline is None
            and self._header_timeout
            and self.timeout_keep_alive_task is None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            self._head_deadline = self.loop.call_later(self._header_timeout, self._head_too_slow)

    def _serve_whole(self, data: bytes) -> bool:
        """Answer a lean path's request that this read holds whole, and nothing else (see
        the module); False, with nothing done, for anything else (uvicorn's parser reads it,
        as every request before)."""
        if b"\r\n\r\n" not in data:
            return False  # (a head cut across reads)
        reader = self._whole
        assert reader is not None
        reader.begun = 0
        reader.complete = reader.expect = False
        try:
            reader.parser.feed_data(data)
            if reader.begun != 1 or not reader.complete:
                raise _NotWhole  # (a body to come, or pipelined requests)
            if reader.expect or reader.upgrade:
                return False
            if self._max_head_bytes and (
                reader.head_bytes > self._max_head_bytes
                or len(reader.headers) > self._max_head_fields
            ):
                return False  # (refused by uvicorn's parser's callbacks)
            url = httptools.parse_url(reader.url)
            raw_path = url.path
            if not raw_path:  # (None for "GET http://host": uvicorn's callback fails, a 400)
                return False
            path = raw_path.decode("ascii")
        except (_NotWhole, httptools.HttpParserError, httptools.HttpParserUpgrade):
            reader.reset()  # (its parser is not at a request's start now)
            return False
        except UnicodeDecodeError:  # (uvicorn's parser refuses it: a 400)
            return False
        finally:
            if not reader.keep_alive:
                # (After a request that ends its connection llhttp takes no other: the next
                # connection's, read by this shared parser, would fail.)
                reader.reset()
        # The scope as uvicorn's on_message_begin and on_headers_complete make it.
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": reader.version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": reader.headers,
            "state": self.app_state.copy(),
            "method": reader.method.decode("ascii"),
            "path": self.root_path + path,
            "raw_path": self.root_path.encode("ascii") + raw_path,
            "query_string": url.query or b"",
        }
        self._extend_scope(scope)
        if not self._direct.take(scope, whole=True):
            return False
        self._unset_keepalive_if_required()
        deadline, self._head_deadline = self._head_deadline, None
        if deadline is not None:
            deadline.cancel()
        self._answering = WholeCycle(scope, reader.body, self, reader.keep_alive)
        self._serve_direct(self._answering)
        return True

    def _whole_answered(self) -> None:
        """A request read whole is answered (as uvicorn's ``on_response_complete``): what came
        meanwhile is read, else the connection is idle from now (:meth:`_idle_check`)."""
        self._answering = None
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self._waiting:
            waiting, self._waiting = self._waiting, b""
            self.data_received(waiting)
            return
        self._idle_since = now = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(now + self.timeout_keep_alive, self._idle_check)

    def _idle_check(self) -> None:
        """uvicorn's keep-alive bound (``timeout_keep_alive``) for a connection whose last
        answer was to a request read whole: closed once idle that long since."""
        self._idle_timer = None
        since = self._idle_since
        if not since or self.transport.is_closing():
            return  # (bytes came since: the next answer looks again)
        due = since + self.timeout_keep_alive
        if self.loop.time() >= due:
            self.transport.close()
        else:
            self._idle_timer = self.loop.call_at(due, self._idle_check)

    def _extend_scope(self, scope: dict[str, Any]) -> None:
        """What a subclass adds to every request's scope (app.tls: the client certificate)."""

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """A request (pipelined or not) begins: the lean paths' are served from here
        (:class:`app.fastpath.DirectPaths`), the others by the app."""
        direct = self._direct
        if direct is not None and app is self.app and direct.take(cycle.scope):
            self._serve_direct(cycle)
        else:
            super()._start_asgi_task(cycle, app)

    def _serve_direct(self, cycle: Any) -> None:
        """A lean path's request answered by DirectPaths, in a task that the server waits
        for at shutdown (as uvicorn's tasks)."""
        task = self.loop.create_task(self._direct.serve(cycle))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _refusing(self) -> bool:
        return self._refused is not None

    def on_message_begin(self) -> None:
        self._in_body = False
        self._in_head = True
        self._heads_begun += 1
        self._head_bytes = _REQUEST_LINE
        self._head_received = self._head_fields = 0
        super().on_message_begin()
        self._extend_scope(self.scope)  # type: ignore[arg-type]

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._max_head_bytes and self._head_bytes > self._max_head_bytes:
            self._stop_parser(ErrorCode.HEADER_TOO_LARGE)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + _HEADER_LINE
        self._head_fields += 1
        if self._max_head_bytes:
            if self._head_bytes > self._max_head_bytes:
                self._stop_parser(ErrorCode.HEADER_TOO_LARGE)
            if self._head_fields > self._max_head_fields:
                self._stop_parser(ErrorCode.HEADER_TOO_MANY)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True  # (until on_message_complete, at once for a request without)
        deadline, self._head_deadline = self._head_deadline, None
        if deadline is not None:
            deadline.cancel()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()

    def _linger_on_close(self) -> bool:
        """Closing while a request's body still arrives (an answer given before reading it:
        a refusal, a 413): half-close and read and drop the rest a while first. Closed at
        once, the client's next bytes would reset the connection, and the reset can lose the
        answer before the client reads it. Bounded as a refused connection is
        (``REFUSAL_LINGER``, ``REFUSAL_DRAIN``), plus the declared rest of a body within
        ``JSGW_MAX_BODY`` (what the gateway would have read anyway)."""
        if not self._in_body or self._refused is not None or self.transport.is_closing():
            return False
        self._in_body = False
        declared = _declared_length(self.cycle.scope) if self.cycle is not None else 0
        if declared > self._max_body:
            declared = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._drain = REFUSAL_DRAIN + declared
        self._refused = self.loop.call_later(REFUSAL_LINGER, self.transport.close)
        return True

    def _stop_parser(self, code: ErrorCode) -> None:
        """Stop the parser in a callback: uvicorn answers through :meth:`send_400_response`."""
        self._head_refusal = code
        raise _HeadRefused(code)

    def send_400_response(self, msg: str) -> None:
        refusal, self._head_refusal = self._head_refusal, None
        if refusal is None:
            super().send_400_response(msg)  # a request the parser could not read
        else:
            self._refuse_head(refusal)

    def _refuse_head(self, code: ErrorCode) -> None:
        """Answer 431 to a head over its bounds, and close (nothing of it reached the app)."""
        self._in_head = False
        deadline, self._head_deadline = self._head_deadline, None
        if deadline is not None:
            deadline.cancel()
        log.debug("refusing a request head: %s", code)
        body = _head_refusal_body(code, self._max_head_bytes, self._max_head_fields)
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/problem+json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        self._answer_and_close(head + body)

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # (not armed during a response; kept so, should one begin meanwhile)
        if not self.transport.is_closing():
            log.debug("closing a connection whose request head took over %ss", self._header_timeout)
            self.transport.close()

    def resume_writing(self) -> None:
        self._resumed_at = self.loop.time()
        super().resume_writing()

    def shutdown(self) -> None:
        if self._answering is not None:  # (its answer goes out, then the connection closes)
            self._answering.keep_alive = False
        else:
            super().shutdown()
        if self._stall_check is None:
            self._stall_check = self.loop.call_later(STALL_GRACE, self._cut_if_stalled)

    def _cut_if_stalled(self) -> None:
        if self.flow.write_paused and self.loop.time() - self._resumed_at >= STALL_GRACE:
            self._stall_check = None
            # The request sees a disconnect (and its writer wakes from the drain): it ends.
            self.transport.abort()
        else:  # still reading, however slowly: looked at again
            self._stall_check = self.loop.call_later(STALL_GRACE, self._cut_if_stalled)

    def eof_received(self) -> None:
        # uvicorn's answer (None) lets the socket's transport close itself, past the
        # gathering one: what it holds is handed over first.
        self.transport.flush()  # type: ignore[attr-defined]
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._stall_check, self._head_deadline, self._refused, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._stall_check = self._head_deadline = self._idle_timer = None
        answering = self._answering
        if answering is not None and not answering.response_complete:
            answering.disconnected = True
            answering.message_event.set()
        super().connection_lost(exc)


@functools.cache
def _head_refusal_body(code: ErrorCode, max_bytes: int, max_fields: int) -> bytes:
    detail = (
        f"the request head is over the limit of {max_bytes} bytes (JSGW_MAX_HEADER_BYTES)"
        if code is ErrorCode.HEADER_TOO_LARGE
        else f"the request has over {max_fields} header fields (JSGW_MAX_HEADER_FIELDS)"
    )
    return orjson.dumps(HeadTooLarge(code, detail).problem())


@functools.cache
def _busy_body() -> bytes:
    error = Unavailable(
        ErrorCode.HTTP_CONNECTION_LIMIT, "this gateway worker is at its limit of open connections"
    )
    return orjson.dumps(error.problem())


@functools.cache
def connection_cap(max_connections: int) -> int:
    """``max_connections``, kept below this process's descriptor limit (less a reserve), so
    that the gateway still has descriptors for its own work when clients take the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - DESCRIPTOR_RESERVE))


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the descriptor soft limit to the hard limit (as Go's runtime and nginx do): the
    default soft limit of many shells and containers, 1,024, is a few hundred clients.
    Returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft, soft
    connection_cap.cache_clear()
    return soft, target


def uvicorn_options(keep_alive_timeout: float = 5.0) -> dict[str, Any]:
    """The uvicorn settings the gateway is served with (by ``jsgw serve``, and by the tests'
    real server): this protocol on uvloop, idle keep-alive connections closed after
    ``keep_alive_timeout``, no proxy headers trusted, and no ``Server`` header (it tells
    anyone the server stack, and is one more header per answer)."""
    return {
        "http": GatheringProtocol,
        "loop": "uvloop",
        "timeout_keep_alive": keep_alive_timeout,
        "proxy_headers": False,
        "server_header": False,
    }


def tune_gc() -> None:
    """Set the process's garbage collector for serving, once what lives as long as the
    process exists."""
    # What exists now (modules, the app, its schemas, its NATS pool) lives as long as the
    # process: out of the collector's sight, full collections under load (thousands of SSE
    # connections) stay short instead of pausing every stream for 0.1-0.2 s.
    gc.collect()
    gc.freeze()
    # A request frees what it allocates by reference counting (no request/response leaves a
    # cycle: tests/integration/test_garbage.py; nor does a KV watch or a batch read:
    # test_garbage_streams.py), so young collections find next to nothing to free; but at the
    # default threshold (700 allocations) the objects of 64 requests in flight set one off
    # every ~50 requests, ~4% of a KV read's CPU. At 10,000 they come when objects really
    # pile up.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


App = TypeVar("App", bound=Starlette)


def once_started(app: App, started: Callable[[Any], Any]) -> App:
    """``app`` (a Starlette app), calling ``started(state)`` when its lifespan has started;
    what that returns is the lifespan state from then on."""
    lifespan_context = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with lifespan_context(app) as state:
            yield started(state)

    app.router.lifespan_context = lifespan
    return app


def tune_gc_once_started(app: App) -> App:
    """``app`` (a Starlette app), calling :func:`tune_gc` when its lifespan has started."""

    def started(state: Any) -> Any:
        tune_gc()
        return state

    return once_started(app, started)
