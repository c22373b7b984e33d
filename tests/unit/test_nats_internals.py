"""What the gateway relies on inside nats-py, beyond its public API.

``app.nats.replies.LeanClient`` subclasses nats-py's ``Client`` and ``app.nats.wire.LeanParser``
its ``Parser``; they and ``app.nats.pool`` read and write private attributes and call private
methods. pyproject.toml pins nats-py to the release these were written and tested against.
This test names each private thing and fails, saying which one and how, when an upgrade
moves or changes it: widening the pin is then a decision (re-read those modules against the
new release), not a surprise in production.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.protocol import parser as nats_parser

from app.nats.embedded import EmbeddedServer
from app.nats.replies import LeanClient
from app.nats.wire import LeanParser
from tests.unit.pinned import Pinned

TESTED = "2.16"  # the nats-py release series the private names below were checked against
PINNED = Pinned("nats-py", TESTED, "app/nats/replies.py, wire.py, pool.py, pull.py")
INSTALLED = PINNED.installed
_fail = PINNED.fail
_require = PINNED.require
_parameters = PINNED.parameters
_source_uses = PINNED.source_uses


def _attribute(obj: Any, name: str, kind: type | tuple[type, ...], owner: str) -> Any:
    what = f"{owner}.{name}"
    if not hasattr(obj, name):
        _fail(what, "does not exist")
    value = getattr(obj, name)
    _require(
        isinstance(value, kind),
        what,
        f"is a {type(value).__name__}, not {getattr(kind, '__name__', kind)}",
    )
    return value


def test_the_installed_release_is_the_tested_one() -> None:
    _require(
        INSTALLED == TESTED or INSTALLED.startswith(TESTED + "."),
        "the installed release",
        f"is not in the {TESTED} series the gateway was tested with",
    )


def test_parser_constants_and_methods() -> None:
    for name, expected in (("AWAITING_CONTROL_LINE", None), ("MAX_CONTROL_LINE_SIZE", 4096)):
        value = _attribute(nats_parser, name, int, "nats.protocol.parser")
        if expected is not None:
            _require(
                value == expected, f"nats.protocol.parser.{name}", f"is {value}, not {expected}"
            )
    parser_class = nats_parser.Parser
    _parameters(getattr(parser_class, "__init__", None), ["self", "nc"], "Parser.__init__",
                coroutine=False)  # fmt: skip
    _parameters(getattr(parser_class, "reset", None), ["self"], "Parser.reset", coroutine=False)
    _parameters(getattr(parser_class, "parse", None), ["self", "data"], "Parser.parse",
                coroutine=True)  # fmt: skip
    # Messages nats-py's parser reads itself must reach LeanClient._process_msg, which hands
    # those of raw subscriptions to their callbacks.
    _source_uses(parser_class.parse, "self.nc._process_msg(", "Parser.parse",
                 "messages it reads would bypass LeanClient._process_msg")  # fmt: skip
    client = Client()
    parser = nats_parser.Parser(client)
    _require(getattr(parser, "nc", None) is client, "Parser.nc", "is not the client given")
    _attribute(parser, "buf", bytearray, "Parser")
    state = _attribute(parser, "state", int, "Parser")
    _require(
        state == nats_parser.AWAITING_CONTROL_LINE,
        "Parser.state",
        "of a new parser is not AWAITING_CONTROL_LINE",
    )
    parser.buf.extend(b"PI")
    parser.reset()
    _require(not parser.buf, "Parser.reset", "does not empty Parser.buf")


def test_client_private_attributes() -> None:
    client = Client()
    owner = "Client"
    _require(isinstance(getattr(Client, "CONNECTED", None), int), "Client.CONNECTED",
             "is not an int status")  # fmt: skip
    _attribute(client, "_status", int, owner)
    parser = _attribute(client, "_ps", nats_parser.Parser, owner)
    _require(parser.nc is client, "Client._ps", "is not the client's own parser")
    _attribute(client, "_pending", list, owner)
    _attribute(client, "_pending_data_size", int, owner)
    _attribute(client, "_max_pending_size", int, owner)
    _attribute(client, "_max_payload", int, owner)
    _attribute(client, "_server_info", dict, owner)
    _attribute(client, "_pings_outstanding", int, owner)
    for name in ("_flush_queue", "_flusher_task"):  # set by connect
        _require(hasattr(client, name), f"Client.{name}", "does not exist")
    stats = _attribute(client, "stats", dict, owner)
    for key in ("out_msgs", "out_bytes", "in_msgs", "in_bytes", "reconnects"):
        _require(isinstance(stats.get(key), int), f"Client.stats[{key!r}]", "is not a counter")
    _require(isinstance(inspect.getattr_static(Client, "max_payload", None), property),
             "Client.max_payload", "is not a property")  # fmt: skip


def test_client_private_methods() -> None:
    _parameters(getattr(Client, "_process_msg", None),
                ["self", "sid", "subject", "reply", "data", "headers"], "Client._process_msg",
                coroutine=True)  # fmt: skip
    _parameters(getattr(Client, "_process_op_err", None), ["self", "e"], "Client._process_op_err",
                coroutine=True)  # fmt: skip
    # LeanClient.publish_queued does what publish does and wakes the flusher the same way: a
    # future put into _flush_queue makes it write out _pending.
    flusher = getattr(Client, "_flusher", None)
    _require(flusher is not None, "Client._flusher", "does not exist")
    for fragment in ("self._flush_queue.get()", "self._pending", "self._pending_data_size = 0"):
        _source_uses(flusher, fragment, "Client._flusher",
                     "LeanClient.publish_queued queues commands for it")  # fmt: skip
    # The pool's ping options: a server that stops answering is noticed after
    # max_outstanding_pings unanswered pings, counted in _pings_outstanding.
    pings = getattr(Client, "_ping_interval", None)
    _require(pings is not None, "Client._ping_interval", "does not exist")
    for fragment in ("self._pings_outstanding", 'self.options["max_outstanding_pings"]',
                     'self.options["ping_interval"]'):  # fmt: skip
        _source_uses(pings, fragment, "Client._ping_interval", "the pool's ping settings")


def test_connect_options_the_pool_passes() -> None:
    parameters = inspect.signature(Client.connect).parameters
    for name in ("ping_interval", "max_outstanding_pings", "pending_size",
                 "reconnect_to_server_handler", "servers", "name", "allow_reconnect",
                 "max_reconnect_attempts", "reconnect_time_wait", "connect_timeout",
                 "disconnected_cb", "reconnected_cb", "closed_cb", "error_cb"):  # fmt: skip
        _require(name in parameters, f"Client.connect({name}=...)", "is not accepted")


def test_subscription_id() -> None:
    _require("id" in inspect.signature(Subscription.__init__).parameters,
             "Subscription.__init__(id=...)", "is not accepted")  # fmt: skip
    subscription = Subscription(None, id=7)
    _require(getattr(subscription, "_id", None) == 7, "Subscription._id",
             "is not the subscription's sid")  # fmt: skip


async def test_message_iterator() -> None:
    """app.nats.pull.unsubscribe drops a subscription's message iterator, which refers back to
    the subscription (a reference cycle per fetch or Direct Get page otherwise); the gateway
    reads with next_msg, which must not need it."""
    subscription = Subscription(None, id=7)
    _require(hasattr(subscription, "_message_iterator"), "Subscription._message_iterator",
             "does not exist")  # fmt: skip
    subscription._start(None)
    iterator = subscription._message_iterator
    _require(iterator is not None and getattr(iterator, "_sub", None) is subscription,
             "Subscription._message_iterator", "is not the iterator over the subscription")
    _source_uses(Subscription.next_msg, "self._pending_queue", "Subscription.next_msg",
                 "messages are read off the pending queue")  # fmt: skip
    _require("_message_iterator" not in inspect.getsource(Subscription.next_msg),
             "Subscription.next_msg", "uses the message iterator, which unsubscribe drops")


async def test_connected_client(nats_server: EmbeddedServer) -> None:
    """What exists only once connected, and a PUB queued the way publish_queued queues it."""
    client = LeanClient()
    await client.connect(nats_server.url, ping_interval=30, max_outstanding_pings=2)
    try:
        owner = "a connected Client"
        _attribute(client, "_flush_queue", asyncio.Queue, owner)
        _attribute(client, "_flusher_task", asyncio.Task, owner)
        _require(client._status == Client.CONNECTED, "Client._status",
                 "of a connected client is not Client.CONNECTED")  # fmt: skip
        info = _attribute(client, "_server_info", dict, owner)
        _require(client._max_payload == info.get("max_payload") == client.max_payload,
                 "Client._max_payload", "is not the server's max_payload")  # fmt: skip
        _require(isinstance(client._ps, LeanParser), "Client._ps",
                 "is replaced on connect: LeanParser no longer reads the socket")  # fmt: skip
        _require(client.options.get("max_outstanding_pings") == 2, "Client.options",
                 "do not keep max_outstanding_pings")  # fmt: skip
        _attribute(client, "_pings_outstanding", int, owner)
        sub = await client.subscribe("internals.check")
        await client.flush()
        _require(client.publish_queued("internals.check", "", b"queued"),
                 "LeanClient.publish_queued", "refused a plain PUB on a connected client")
        msg = await sub.next_msg(timeout=2)
        _require(msg.data == b"queued", "Client._flusher", "did not write what was queued")
        _require(not client._pending and client._pending_data_size == 0, "Client._pending",
                 "is not emptied by the flusher")  # fmt: skip
    finally:
        await client.close()
