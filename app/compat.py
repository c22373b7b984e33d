"""What the gateway uses of nats-py, uvicorn, sse-starlette and prometheus-client beyond their
public APIs.

The fast paths subclass other libraries' classes and touch their private names. Every such
name is reached through this module, and :func:`check` verifies, once per process at start-up
(``jsgw serve`` before it starts uvicorn, and the app's lifespan), that the installed releases
still have each of them in the form the gateway relies on. pyproject.toml caps the
libraries at the release series tested (:data:`NATS`, :data:`UVICORN`, :data:`SSE`,
:data:`PROMETHEUS`) and
constraints.txt pins them; an upgrade that moves a name fails start-up with a message naming
the library, its version, the tested series, what moved and which module uses it, instead
of misbehaving under load. Widening a pin is then a decision: re-read the modules named
below against the new release, adjust them and this list, then regenerate constraints.txt.

nats-py (``nats.aio.client.Client``, ``nats.protocol.parser.Parser``, ``Subscription``):

- app/nats/wire.py: ``LeanParser`` subclasses ``Parser`` (``__init__(nc)``, ``reset()``,
  ``parse(data)``, and its ``nc``, ``buf`` and ``state``), reads ``AWAITING_CONTROL_LINE``
  and ``MAX_CONTROL_LINE_SIZE``, and hands messages to ``Client._process_msg`` as
  ``Parser.parse`` does.
- app/nats/replies.py: ``LeanClient`` subclasses ``Client``; it replaces ``_ps`` (the
  parser), overrides ``_process_msg``, and queues commands for ``_flusher`` the way
  ``publish`` does: ``_status`` (``Client.CONNECTED``), ``_flush_queue``, ``_flusher_task``,
  ``_max_payload``, ``_max_pending_size``, ``_pending``, ``_pending_data_size``, ``stats``;
  ``flush_in_order`` waits for ``_flush_pending(force_flush=True)`` before nats-py's flush.
  It keys raw subscriptions by ``Subscription._id`` (:func:`subscription_id`).
- app/nats/pool.py: discards ``_pending``/``_pending_data_size`` of a dropped connection
  (:func:`discard_unsent`), reconnects a silent one through ``_process_op_err``
  (:func:`force_reconnect`), reads ``_server_info`` (:func:`server_info`), relies on
  ``_ping_interval`` counting unanswered pings in ``_pings_outstanding`` against its ping
  options, and on the ``Srv.uri`` of the servers its reconnect handler chooses from.
- app/nats/pull.py: drops ``Subscription._message_iterator`` (:func:`drop_message_iterator`),
  reading with ``next_msg``, which takes messages off ``_pending_queue``.

uvicorn (``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, ``uvicorn.server``):

- app/serving.py: ``GatheringProtocol`` subclasses ``HttpToolsProtocol`` (``__init__``,
  ``connection_made``, ``connection_lost``, ``pause_writing``, ``resume_writing``,
  ``shutdown``, and its ``loop``, ``flow`` (``FlowControl.write_paused``) and ``transport``);
  it counts on ``Server.shutdown`` shutting connections down one by one through
  ``server_state.connections`` (what ``connection_made``/``connection_lost`` register), on
  ``Server._wait_tasks_to_complete`` waiting for them, and on uvicorn writing a response's
  head in a write of its own (tests/unit/test_uvicorn_internals.py drives a connection).
  To bound request heads and connections it overrides ``data_received`` and
  ``on_headers_complete`` (llhttp's callback: a head is complete); to bound a head's size and
  fields it overrides ``on_message_begin``, ``on_url`` and ``on_header`` (raising from them
  stops the parser, which uvicorn answers through ``send_400_response``, overridden to answer
  431), and reads the lifespan state
  ``app_state``, the live ``connections`` set, the request in flight (``cycle``,
  ``response_complete``), the waiting ``pipeline`` and the keep-alive timer
  (``timeout_keep_alive_task``), and passes ``timeout_keep_alive``.
- app/serving.py and app/fastpath.py (``DirectPaths``): the lean paths are started where
  uvicorn starts a request's task (``_start_asgi_task(cycle, app)``, called for a request and
  for a pipelined one), and answered through uvicorn's ``RequestResponseCycle``: its
  ``scope``, ``receive``, ``send``, ``send_500_response``, ``transport``, ``flow``
  (``drain``), ``default_headers``, ``keep_alive``, ``more_body``, ``disconnected``,
  ``message_event``, ``response_started``, ``response_complete``,
  ``waiting_for_100_continue`` and ``on_response``; a whole answer is written as ``send``
  writes it, with its ``STATUS_LINE``, ``HEADER_RE`` and ``HEADER_VALUE_RE``
  (:func:`uvicorn_wire`).
- app/serving.py: a request read whole (``GatheringProtocol._serve_whole``) gets the scope
  ``on_message_begin``, ``on_header`` and ``on_headers_complete`` would make (``asgi_version``,
  ``server``, ``client``, ``scheme``, ``root_path``, ``app_state``, ``parse_url``, the
  unquoted path, keep-alive), is not read so with ``limit_concurrency`` set, and is accounted
  as ``on_response_complete`` does (``server_state.total_requests``,
  ``flow.resume_reading``, idle connections closed after ``timeout_keep_alive``, by a timer
  of its own, as ``timeout_keep_alive_handler`` closes them; uvicorn's own keep-alive timer,
  ``timeout_keep_alive_task``, is disarmed by ``_unset_keepalive_if_required``); its
  ``shutdown`` would close a connection whose request read whole is being answered (uvicorn
  looks at its own ``cycle``), so that case is overridden.
- app/tls.py: ``ClientCertProtocol`` adds to every request's ``scope`` (uvicorn's, made in
  ``on_message_begin``, and a request read whole's).
- app/sse.py: ``server_exiting`` finds uvicorn's ``Server`` as the SIGTERM handler's
  ``__self__`` (``Server.capture_signals`` installs ``Server.handle_exit``) and reads its
  ``should_exit``.
- app/cli.py, app/serving.py, app/tls.py: the ``uvicorn.run`` options passed.

prometheus-client (``prometheus_client.mmap_dict``):

- app/metrics.py: with several workers, writes its lock-free series into files of its own
  with ``MmapedDict`` (``write_value``, ``read_value``, ``close``) under keys from ``mmap_key``,
  in the format ``MultiProcessCollector`` reads (checked by writing one and reading it back).

sse-starlette:

- app/sse.py: reads ``sse_starlette.sse.AppStatus.should_exit`` (not exported by the
  package), and passes ``EventSourceResponse`` its shutdown and ping options.

The nats-py names are imported here at once (the NATS kit needs them anyway); uvicorn's and
sse-starlette's only when asked for, so that the NATS kit and the services do not load the
HTTP server. Reading a function's source is how a few checks see what it does; where sources
are not installed those checks are skipped (the unit tests run them).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NatsClient
from nats.aio.client import Srv as NatsServer
from nats.aio.subscription import Subscription as NatsSubscription
from nats.protocol import parser as _nats_parser
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE
from nats.protocol.parser import Parser as NatsParser

if TYPE_CHECKING:
    from sse_starlette.sse import AppStatus as SseAppStatus
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "AWAITING_CONTROL_LINE",
    "MAX_CONTROL_LINE_SIZE",
    "NATS",
    "SSE",
    "UVICORN",
    "HttpToolsProtocol",
    "NatsClient",
    "NatsParser",
    "NatsSubscription",
    "SseAppStatus",
    "check",
    "discard_unsent",
    "drop_message_iterator",
    "force_reconnect",
    "problems",
    "server_info",
    "subscription_id",
    "uvicorn_wire",
]

log = logging.getLogger("jsgw.compat")

_LAZY = {
    "HttpToolsProtocol": ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
    "SseAppStatus": ("sse_starlette.sse", "AppStatus"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(import_module(module), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Pin:
    """A library capped at the release series ``tested`` (pyproject.toml says the same)."""

    distribution: str
    tested: str

    @property
    def installed(self) -> str:
        return version(self.distribution)

    @property
    def in_tested_series(self) -> bool:
        installed = self.installed
        return installed == self.tested or installed.startswith(self.tested + ".")

    def problem(self, what: str, how: str, users: str) -> str:
        return (
            f"{self.distribution} {self.installed} (tested: {self.tested}.x): {what} {how}; "
            f"used by {users}"
        )


NATS = Pin("nats-py", "2.16")
UVICORN = Pin("uvicorn", "0.54")
SSE = Pin("sse-starlette", "3.7")
PROMETHEUS = Pin("prometheus-client", "0.26")
PINS = (NATS, UVICORN, SSE, PROMETHEUS)


# -- the private names, reached from the gateway's modules ---------------------------------


def subscription_id(sub: NatsSubscription) -> int:
    """The sid nats-py hands to ``_process_msg`` for messages of ``sub``."""
    sid: int = sub._id
    return sid


def discard_unsent(client: NatsClient) -> None:
    """Forget the commands a client has queued but not written."""
    client._pending = []
    client._pending_data_size = 0


async def force_reconnect(client: NatsClient, error: Exception) -> None:
    """Treat the connection as broken by ``error``: nats-py reconnects as after a read error."""
    await client._process_op_err(error)


def server_info(client: NatsClient) -> dict[str, Any]:
    """The INFO the server sent on connecting."""
    return dict(client._server_info)


# A pattern that is one character class (``[...]``, escapes allowed): it matches one byte, so
# searching the concatenation of texts finds what searching each of them finds.
_ONE_CLASS = re.compile(rb"\[(?:\\.|[^\]\\])*\]", re.S)
# (DirectPaths checks names lower-cased: right while the pattern matches no letter.)
_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))


def uvicorn_wire() -> tuple[dict[int, bytes], Any, Any]:
    """uvicorn's status lines by code, and its patterns of a header name and value it refuses
    to write."""
    from uvicorn.protocols.http import httptools_impl

    return httptools_impl.STATUS_LINE, httptools_impl.HEADER_RE, httptools_impl.HEADER_VALUE_RE


def drop_message_iterator(sub: NatsSubscription) -> None:
    """Cut the subscription's link to its message iterator (which links back to it)."""
    sub._message_iterator = None


# -- the start-up check ----------------------------------------------------------------------


class _Checks:
    """Collects what moved, one line per name, for one library and the modules using it."""

    def __init__(self, pin: Pin, found: list[str]) -> None:
        self.pin = pin
        self.found = found

    def require(self, condition: bool, what: str, how: str, users: str) -> bool:
        if not condition:
            self.found.append(self.pin.problem(what, how, users))
        return condition

    def exists(self, owner: Any, name: str, what: str, users: str) -> Any:
        value = getattr(owner, name, None)
        self.require(value is not None, what, "does not exist", users)
        return value

    def attribute(
        self, owner: Any, name: str, kind: type | tuple[type, ...], what: str, users: str
    ) -> Any:
        value = getattr(owner, name, None)
        if not hasattr(owner, name):
            self.require(False, what, "does not exist", users)
        else:
            self.require(
                isinstance(value, kind),
                what,
                f"is a {type(value).__name__}, not {getattr(kind, '__name__', kind)}",
                users,
            )
        return value

    def parameters(
        self, function: Any, expected: list[str], what: str, users: str, *, coroutine: bool
    ) -> None:
        """``function`` exists, is (or is not) a coroutine function, and takes ``expected``."""
        if not self.require(callable(function), what, "does not exist", users):
            return
        self.require(
            inspect.iscoroutinefunction(function) == coroutine,
            what,
            "is no longer a coroutine function" if coroutine else "became a coroutine function",
            users,
        )
        names = list(inspect.signature(function).parameters)
        self.require(
            names == expected,
            what,
            f"takes ({', '.join(names)}), not ({', '.join(expected)})",
            users,
        )

    def accepts(self, function: Any, names: Iterable[str], what: str, users: str) -> None:
        parameters = inspect.signature(function).parameters
        for name in names:
            self.require(name in parameters, f"{what}({name}=...)", "is not accepted", users)

    def absent(self, owner: type, names: Iterable[str], users: str) -> None:
        """Names the gateway's subclass adds: the library must not have them."""
        for name in names:
            self.require(
                not hasattr(owner, name),
                f"{owner.__name__}.{name}",
                "now exists, and would be shadowed",
                users,
            )

    def source_uses(
        self,
        function: Any,
        fragments: Iterable[str],
        what: str,
        why: str,
        users: str,
        *,
        absent: Iterable[str] = (),
    ) -> None:
        if function is None:
            return  # (reported where it was looked up)
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            return  # no sources installed: the unit tests read them
        for fragment in fragments:
            self.require(fragment in source, what, f"no longer uses {fragment!r} ({why})", users)
        for fragment in absent:
            self.require(fragment not in source, what, f"now uses {fragment!r} ({why})", users)


def _check_nats(c: _Checks) -> None:
    wire, replies = "app/nats/wire.py", "app/nats/replies.py"
    pool, pull = "app/nats/pool.py", "app/nats/pull.py"
    for name, expected in (("AWAITING_CONTROL_LINE", None), ("MAX_CONTROL_LINE_SIZE", 4096)):
        value = c.attribute(_nats_parser, name, int, f"nats.protocol.parser.{name}", wire)
        if expected is not None and isinstance(value, int):
            c.require(
                value == expected,
                f"nats.protocol.parser.{name}",
                f"is {value}, not {expected}",
                wire,
            )
    parser = NatsParser
    c.parameters(
        getattr(parser, "__init__", None), ["self", "nc"], "Parser.__init__", wire, coroutine=False
    )
    c.parameters(getattr(parser, "reset", None), ["self"], "Parser.reset", wire, coroutine=False)
    c.parameters(
        getattr(parser, "parse", None), ["self", "data"], "Parser.parse", wire, coroutine=True
    )
    c.source_uses(
        getattr(parser, "parse", None),
        ["self.nc._process_msg("],
        "Parser.parse",
        "messages it reads would bypass LeanClient._process_msg",
        replies,
    )
    client = NatsClient()
    instance = NatsParser(client)
    c.require(getattr(instance, "nc", None) is client, "Parser.nc", "is not the client given", wire)
    c.attribute(instance, "buf", bytearray, "Parser.buf", wire)
    state = c.attribute(instance, "state", int, "Parser.state", wire)
    c.require(
        state == AWAITING_CONTROL_LINE,
        "Parser.state",
        "of a new parser is not AWAITING_CONTROL_LINE",
        wire,
    )

    c.parameters(
        getattr(NatsClient, "_process_msg", None),
        ["self", "sid", "subject", "reply", "data", "headers"],
        "Client._process_msg",
        f"{replies}, {wire}",
        coroutine=True,
    )
    c.require(
        isinstance(getattr(NatsClient, "CONNECTED", None), int),
        "Client.CONNECTED",
        "is not an int status",
        replies,
    )
    ps = c.attribute(client, "_ps", NatsParser, "Client._ps", replies)
    c.require(
        getattr(ps, "nc", None) is client, "Client._ps", "is not the client's own parser", replies
    )
    for name, kind, users in (
        ("_status", int, replies),
        ("_pending", list, f"{replies}, {pool}"),
        ("_pending_data_size", int, f"{replies}, {pool}"),
        ("_max_pending_size", int, replies),
        ("_max_payload", int, replies),
        ("_server_info", dict, pool),
        ("_pings_outstanding", int, pool),
        ("stats", dict, replies),
    ):
        c.attribute(client, name, kind, f"Client.{name}", users)
    for name in ("_flush_queue", "_flusher_task"):  # (set by connect)
        c.require(hasattr(client, name), f"Client.{name}", "does not exist", replies)
    stats = getattr(client, "stats", None)
    for key in ("out_msgs", "out_bytes"):
        c.require(
            isinstance(stats, dict) and isinstance(stats.get(key), int),
            f"Client.stats[{key!r}]",
            "is not a counter",
            replies,
        )
    c.parameters(
        getattr(NatsClient, "_flush_pending", None),
        ["self", "force_flush"],
        "Client._flush_pending",
        replies,
        coroutine=True,
    )
    flusher = c.exists(NatsClient, "_flusher", "Client._flusher", replies)
    c.source_uses(
        flusher,
        ["self._flush_queue.get()", "self._pending", "self._pending_data_size = 0"],
        "Client._flusher",
        "LeanClient.publish_queued queues commands for it",
        replies,
    )
    c.parameters(
        getattr(NatsClient, "_process_op_err", None),
        ["self", "e"],
        "Client._process_op_err",
        pool,
        coroutine=True,
    )
    pings = c.exists(NatsClient, "_ping_interval", "Client._ping_interval", pool)
    c.source_uses(
        pings,
        [
            "self._pings_outstanding",
            'self.options["max_outstanding_pings"]',
            'self.options["ping_interval"]',
        ],
        "Client._ping_interval",
        "the pool's ping settings",
        pool,
    )
    c.accepts(
        NatsClient.connect,
        (
            "ping_interval",
            "max_outstanding_pings",
            "pending_size",
            "reconnect_to_server_handler",
            "servers",
            "name",
            "allow_reconnect",
            "max_reconnect_attempts",
            "reconnect_time_wait",
            "connect_timeout",
            "disconnected_cb",
            "reconnected_cb",
            "closed_cb",
            "error_cb",
        ),
        "Client.connect",
        pool,
    )
    c.require(
        "uri" in getattr(NatsServer, "__dataclass_fields__", {}), "Srv.uri", "does not exist", pool
    )

    c.accepts(NatsSubscription.__init__, ("id",), "Subscription.__init__", replies)
    sub = NatsSubscription(None, id=7)
    c.require(
        getattr(sub, "_id", None) == 7, "Subscription._id", "is not the subscription's sid", replies
    )
    c.require(
        hasattr(sub, "_message_iterator"), "Subscription._message_iterator", "does not exist", pull
    )
    c.source_uses(
        NatsSubscription.next_msg,
        ["self._pending_queue"],
        "Subscription.next_msg",
        "messages are read off the pending queue",
        pull,
        absent=["_message_iterator"],
    )


def _check_uvicorn(c: _Checks) -> None:
    from uvicorn.config import HTTP_PROTOCOLS, Config
    from uvicorn.protocols.http import httptools_impl
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.server import Server

    serving, tls, sse = "app/serving.py", "app/tls.py", "app/sse.py"
    base = getattr(httptools_impl, "HttpToolsProtocol", None)
    if not isinstance(base, type):
        c.require(
            False,
            "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol",
            "does not exist",
            f"{serving}, {tls}",
        )
        return
    c.require(
        HTTP_PROTOCOLS.get("httptools", "").endswith("httptools_impl:HttpToolsProtocol"),
        "uvicorn.config.HTTP_PROTOCOLS['httptools']",
        "is not HttpToolsProtocol",
        serving,
    )
    # uvicorn's Server makes one per connection with these keywords.
    c.parameters(
        base.__dict__.get("__init__"),
        ["self", "config", "server_state", "app_state", "_loop"],
        "HttpToolsProtocol.__init__",
        serving,
        coroutine=False,
    )
    for name, parameters, users in (
        ("connection_made", ["self", "transport"], serving),
        ("connection_lost", ["self", "exc"], serving),
        ("pause_writing", ["self"], serving),
        ("resume_writing", ["self"], serving),
        ("shutdown", ["self"], serving),
        ("on_message_begin", ["self"], f"{serving}, {tls}"),
        ("on_url", ["self", "url"], serving),
        ("on_header", ["self", "name", "value"], serving),
        ("on_headers_complete", ["self"], serving),
        ("on_message_complete", ["self"], serving),
        ("data_received", ["self", "data"], serving),
        ("send_400_response", ["self", "msg"], serving),
    ):
        c.parameters(
            base.__dict__.get(name), parameters, f"HttpToolsProtocol.{name}", users, coroutine=False
        )
    c.absent(
        base,
        (
            "_stall_check",
            "_resumed_at",
            "_cut_if_stalled",
            "_header_timeout",
            "_head_deadline",
            "_refused",
            "_head_too_slow",
            "_refuse",
            "_drain",
            "_answer_and_close",
            "_max_head_bytes",
            "_max_head_fields",
            "_in_head",
            "_head_bytes",
            "_head_received",
            "_head_fields",
            "_head_refusal",
            "_stop_parser",
            "_refuse_head",
            "_refusing",
            "_in_body",
            "_max_body",
            "_linger_on_close",
            "_direct",
        ),
        serving,
    )
    c.absent(base, ("_client_cert_name",), tls)
    direct = f"{serving}, app/fastpath.py"
    c.parameters(
        base.__dict__.get("_start_asgi_task"),
        ["self", "cycle", "app"],
        "HttpToolsProtocol._start_asgi_task",
        direct,
        coroutine=False,
    )
    for method in ("on_headers_complete", "on_response_complete"):
        c.source_uses(
            base.__dict__.get(method),
            ["self._start_asgi_task(", "self.pipeline"],
            f"HttpToolsProtocol.{method}",
            "every request's task, pipelined or not, is started there",
            direct,
        )
    cycle = getattr(httptools_impl, "RequestResponseCycle", None)
    c.require(isinstance(cycle, type), "RequestResponseCycle", "does not exist", direct)
    if isinstance(cycle, type):
        for name, parameters in (
            ("receive", ["self"]),
            ("send", ["self", "message"]),
            ("send_500_response", ["self"]),
        ):
            c.parameters(
                cycle.__dict__.get(name),
                parameters,
                f"RequestResponseCycle.{name}",
                direct,
                coroutine=True,
            )
        c.source_uses(
            cycle.__dict__.get("__init__"),
            [
                "self.scope = scope",
                "self.transport = transport",
                "self.flow = flow",
                "self.default_headers = default_headers",
                "self.message_event = message_event",
                "self.on_response = on_response",
                "self.disconnected = False",
                "self.keep_alive = keep_alive",
                "self.waiting_for_100_continue = expect_100_continue",
                "self.more_body = True",
                "self.response_started = False",
                "self.response_complete = False",
            ],
            "RequestResponseCycle.__init__",
            "DirectPaths answers through the cycle's state",
            direct,
        )
        c.source_uses(
            cycle.__dict__.get("send"),
            [
                "content = [STATUS_LINE[status_code]]",
                "headers = self.default_headers + list(",
                "HEADER_RE.search(name)",
                "HEADER_VALUE_RE.search(value)",
                'content.append(b"connection: close\\r\\n")',
                "self.response_complete = True",
                "self.message_event.set()",
                "self.transport.close()",
                "self.on_response()",
            ],
            "RequestResponseCycle.send",
            "DirectPaths writes a whole answer as send does",
            direct,
        )
    c.attribute(httptools_impl, "STATUS_LINE", dict, "httptools_impl.STATUS_LINE", direct)
    for name in ("HEADER_RE", "HEADER_VALUE_RE"):
        pattern = c.attribute(httptools_impl, name, re.Pattern, f"httptools_impl.{name}", direct)
        if isinstance(pattern, re.Pattern):
            c.require(
                _ONE_CLASS.fullmatch(pattern.pattern) is not None
                and pattern.search(_LETTERS) is None,
                f"httptools_impl.{name}",
                f"is {pattern.pattern!r}, not one character class without letters (searched "
                "over all headers at once, names lower-cased)",
                direct,
            )
    c.source_uses(
        FlowControl.__init__,
        ["self.write_paused = False"],
        "FlowControl.__init__",
        "GatheringProtocol reads flow.write_paused",
        serving,
    )
    c.source_uses(
        base.__dict__.get("connection_made"),
        [
            "self.connections.add(self)",
            "self.transport = transport",
            "self.flow = FlowControl(transport)",
        ],
        "HttpToolsProtocol.connection_made",
        "the server shuts down what it registers, through this transport",
        serving,
    )
    c.source_uses(
        base.__dict__.get("__init__"),
        [
            "self.app_state = app_state",
            "self.connections = server_state.connections",
            "self.timeout_keep_alive_task",
            "self.pipeline",
            "self.cycle",
        ],
        "HttpToolsProtocol.__init__",
        "GatheringProtocol reads its limits from the lifespan state and counts connections",
        serving,
    )
    c.source_uses(
        base.__dict__.get("data_received"),
        [
            "self._unset_keepalive_if_required()",
            "self.parser.feed_data(data)",
            "except httptools.HttpParserError:",
            "self.send_400_response(msg)",
        ],
        "HttpToolsProtocol.data_received",
        "the parser's callbacks tell GatheringProtocol where a request head begins and ends, "
        "and a callback that raises stops the parser and is answered by send_400_response",
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_header"),
        ["self.headers.append((name, value))"],
        "HttpToolsProtocol.on_header",
        "GatheringProtocol counts a request's header fields where they are added",
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_message_begin"),
        ["self.headers = []"],
        "HttpToolsProtocol.on_message_begin",
        "GatheringProtocol starts counting a head where its headers start",
        serving,
    )
    c.source_uses(
        base.__dict__.get("connection_lost"),
        ["self.connections.discard(self)"],
        "HttpToolsProtocol.connection_lost",
        "a cut connection no longer holds the exit",
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_message_begin"),
        ["self.scope = "],
        "HttpToolsProtocol.on_message_begin",
        "ClientCertProtocol adds to the scope",
        tls,
    )
    # A request read whole gets the scope, keep-alive and accounting uvicorn's callbacks give
    # it (tests/integration/test_whole_reads.py compares both ways on a real socket).
    whole = "a request read whole is read, and answered, as uvicorn's callbacks do it"
    c.source_uses(
        base.__dict__.get("on_message_begin"),
        [
            '"asgi": {"version": self.asgi_version, "spec_version": "2.3"}',
            '"server": self.server',
            '"client": self.client',
            '"scheme": self.scheme',
            '"root_path": self.root_path',
            '"state": self.app_state.copy()',
        ],
        "HttpToolsProtocol.on_message_begin",
        whole,
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_header"),
        ["name = name.lower()", 'if name == b"expect"'],
        "HttpToolsProtocol.on_header",
        whole,
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_headers_complete"),
        [
            "parsed_url = httptools.parse_url(self.url)",
            "path = urllib.parse.unquote(path)",
            "full_path = self.root_path + path",
            'full_raw_path = self.root_path.encode("ascii") + raw_path',
            'self.scope["query_string"] = parsed_url.query or b""',
            'keep_alive=http_version != "1.0" and self.parser.should_keep_alive()',
            "if self.limit_concurrency is not None",
        ],
        "HttpToolsProtocol.on_headers_complete",
        whole,
        serving,
    )
    c.source_uses(
        base.__dict__.get("on_response_complete"),
        [
            "self.server_state.total_requests += 1",
            "self.flow.resume_reading()",
            "self.timeout_keep_alive, self.timeout_keep_alive_handler",
        ],
        "HttpToolsProtocol.on_response_complete",
        whole,
        serving,
    )
    c.source_uses(
        base.__dict__.get("shutdown"),
        ["if self.cycle is None or self.cycle.response_complete:"],
        "HttpToolsProtocol.shutdown",
        "it would close a connection whose request read whole is being answered",
        serving,
    )
    c.source_uses(
        Server.shutdown,
        ["connection.shutdown()", "self.server_state.connections"],
        "Server.shutdown",
        "GatheringProtocol.shutdown starts the stall check from it",
        serving,
    )
    c.source_uses(
        getattr(Server, "_wait_tasks_to_complete", None),
        ["self.server_state.connections"],
        "Server._wait_tasks_to_complete",
        "a stalled connection holds the exit until it is cut",
        serving,
    )
    c.source_uses(
        Server.capture_signals,
        ["signal.signal(sig, self.handle_exit)"],
        "Server.capture_signals",
        "server_exiting finds the server through it",
        sse,
    )
    c.accepts(
        Config.__init__,
        (
            "http",
            "loop",
            "timeout_keep_alive",
            "proxy_headers",
            "server_header",
            "factory",
            "host",
            "port",
            "workers",
            "access_log",
            "log_config",
            "timeout_graceful_shutdown",
            "ssl_certfile",
            "ssl_keyfile",
            "ssl_ca_certs",
            "ssl_cert_reqs",
        ),
        "uvicorn.Config",
        "app/cli.py, app/serving.py, app/tls.py",
    )


def _check_sse(c: _Checks) -> None:
    from sse_starlette import EventSourceResponse
    from sse_starlette import sse as sse_module

    sse = "app/sse.py"
    status = c.exists(sse_module, "AppStatus", "sse_starlette.sse.AppStatus", sse)
    if status is not None:
        c.attribute(status, "should_exit", bool, "AppStatus.should_exit", sse)
    c.accepts(
        EventSourceResponse.__init__,
        (
            "background",
            "ping",
            "ping_message_factory",
            "headers",
            "shutdown_event",
            "shutdown_grace_period",
        ),
        "EventSourceResponse",
        sse,
    )


def _check_prometheus(c: _Checks) -> None:
    import tempfile
    from pathlib import Path

    from prometheus_client import mmap_dict

    users = "app/metrics.py"
    files = c.exists(mmap_dict, "MmapedDict", "prometheus_client.mmap_dict.MmapedDict", users)
    key = c.exists(mmap_dict, "mmap_key", "prometheus_client.mmap_dict.mmap_key", users)
    if key is not None:
        c.parameters(
            key,
            ["metric_name", "name", "labelnames", "labelvalues", "help_text"],
            "mmap_key",
            users,
            coroutine=False,
        )
    if files is None:
        return
    c.parameters(
        getattr(files, "read_value", None),
        ["self", "key"],
        "MmapedDict.read_value",
        users,
        coroutine=False,
    )
    c.parameters(
        getattr(files, "write_value", None),
        ["self", "key", "value", "timestamp"],
        "MmapedDict.write_value",
        users,
        coroutine=False,
    )
    if key is None:
        return
    # What a worker writes, prometheus_client's multiprocess collector must read back.
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "counter_1.db")
        name = mmap_dict.mmap_key("jsgw_check", "jsgw_check_total", [], [], "check")
        written = files(path)
        written.write_value(name, 2.0, 0.0)
        written.close()
        values = list(files.read_all_values_from_file(path))
        c.require(
            [(k, v) for k, v, *_ in values] == [(name, 2.0)],
            "MmapedDict files",
            f"read back as {values!r}",
            users,
        )


_CHECKS: tuple[tuple[Pin, Callable[[_Checks], None]], ...] = (
    (NATS, _check_nats),
    (UVICORN, _check_uvicorn),
    (SSE, _check_sse),
    (PROMETHEUS, _check_prometheus),
)


def problems() -> list[str]:
    """What moved, one line per private name; empty when the gateway can run."""
    found: list[str] = []
    for pin, check_library in _CHECKS:
        try:
            check_library(_Checks(pin, found))
        except Exception as exc:  # noqa: BLE001 - a check that breaks is itself what moved
            found.append(pin.problem("the check", f"broke: {exc!r}", "app/compat.py"))
    return found


@functools.cache
def check() -> None:
    """Verify, once per process, the private names the gateway uses; RuntimeError if any
    moved (a library other than the tested one installed)."""
    found = problems()
    if found:
        raise RuntimeError(
            "jsgw cannot run with the installed libraries: private names it relies on moved.\n"
            + "".join(f"  - {line}\n" for line in found)
            + "Install the tested versions (pip install -c constraints.txt), or adapt the "
            "modules named to the installed release (app/compat.py lists what they use) and "
            "widen its pin in pyproject.toml."
        )
    for pin in PINS:
        if not pin.in_tested_series:
            log.warning(
                "%s %s is installed, but jsgw was tested with %s.x; its private names check out",
                pin.distribution,
                pin.installed,
                pin.tested,
            )
