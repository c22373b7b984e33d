"""What the gateway relies on inside nats-py, beyond its public API.

``app.nats.replies.LeanClient`` subclasses nats-py's ``Client`` and ``app.nats.wire.LeanParser``
its ``Parser``; they and ``app.nats.pool`` and ``app.nats.pull`` read and write private
attributes and call private methods. app/compat.py lists each of them and checks, at start-up
and here, that they still exist in the form relied on; these tests add what only running
them shows. pyproject.toml pins nats-py to the release series these were written and tested
against: when an upgrade moves or changes one of them, a test fails saying which one and
how, and widening the pin is a decision (re-read those modules against the new release), not
a surprise in production.
"""

from __future__ import annotations

import asyncio

from app.compat import (
    AWAITING_CONTROL_LINE,
    NATS,
    NatsClient,
    NatsParser,
    NatsSubscription,
)
from app.nats.embedded import EmbeddedServer
from app.nats.replies import LeanClient
from app.nats.wire import LeanParser
from tests.unit.pinned import Pinned

PINNED = Pinned(NATS, "app/nats/replies.py, wire.py, pool.py, pull.py")
_fail = PINNED.fail
_require = PINNED.require


def _attribute(obj: object, name: str, kind: type, owner: str) -> object:
    what = f"{owner}.{name}"
    if not hasattr(obj, name):
        _fail(what, "does not exist")
    value = getattr(obj, name)
    _require(isinstance(value, kind), what, f"is a {type(value).__name__}, not {kind.__name__}")
    return value


def test_the_installed_release_is_the_tested_one() -> None:
    PINNED.in_tested_series()


def test_nothing_the_gateway_relies_on_moved() -> None:
    """app.compat's list of nats-py's private names: each one still there, as relied on."""
    PINNED.nothing_moved()


def test_parser_reset() -> None:
    parser = NatsParser(NatsClient())
    parser.buf.extend(b"PI")
    parser.state = AWAITING_CONTROL_LINE + 1
    parser.reset()
    _require(not parser.buf, "Parser.reset", "does not empty Parser.buf")
    _require(
        parser.state == AWAITING_CONTROL_LINE,
        "Parser.reset",
        "does not go back to AWAITING_CONTROL_LINE",
    )


async def test_message_iterator() -> None:
    """app.nats.pull.unsubscribe drops a subscription's message iterator, which refers back to
    the subscription (a reference cycle per fetch or Direct Get page otherwise); the gateway
    reads with next_msg, which must not need it (app.compat checks that)."""
    subscription = NatsSubscription(None, id=7)
    subscription._start(None)
    iterator = subscription._message_iterator
    _require(
        iterator is not None and getattr(iterator, "_sub", None) is subscription,
        "Subscription._message_iterator",
        "is not the iterator over the subscription",
    )


async def test_connected_client(nats_server: EmbeddedServer) -> None:
    """What exists only once connected, and a PUB queued the way publish_queued queues it."""
    client = LeanClient()
    await client.connect(nats_server.url, ping_interval=30, max_outstanding_pings=2)
    try:
        owner = "a connected Client"
        _attribute(client, "_flush_queue", asyncio.Queue, owner)
        _attribute(client, "_flusher_task", asyncio.Task, owner)
        _require(
            client._status == NatsClient.CONNECTED,
            "Client._status",
            "of a connected client is not Client.CONNECTED",
        )
        info = _attribute(client, "_server_info", dict, owner)
        _require(
            client._max_payload == info.get("max_payload") == client.max_payload,
            "Client._max_payload",
            "is not the server's max_payload",
        )
        _require(
            isinstance(client._ps, LeanParser),
            "Client._ps",
            "is replaced on connect: LeanParser no longer reads the socket",
        )
        _require(
            client.options.get("max_outstanding_pings") == 2,
            "Client.options",
            "do not keep max_outstanding_pings",
        )
        _attribute(client, "_pings_outstanding", int, owner)
        sub = await client.subscribe("internals.check")
        await client.flush()
        _require(
            client.publish_queued("internals.check", "", b"queued"),
            "LeanClient.publish_queued",
            "refused a plain PUB on a connected client",
        )
        msg = await sub.next_msg(timeout=2)
        _require(msg.data == b"queued", "Client._flusher", "did not write what was queued")
        _require(
            not client._pending and client._pending_data_size == 0,
            "Client._pending",
            "is not emptied by the flusher",
        )
    finally:
        await client.close()
