"""Filters against rule prefixes, consume denials, message-id scoping (no server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from app import errors
from app.auth import access
from app.auth.policy import Principal, Rule, parse_pattern
from app.auth.subjects import confined, head, reaches
from app.consumers.service import ConsumerService
from app.nats.consume import Delivered
from app.publish.service import Outgoing, for_writer, id_scope, scrubbed


def principal(name: str, *rules: tuple[str, list[str]]) -> Principal:
    return Principal(name, tuple(Rule(parse_pattern(r), frozenset(a)) for r, a in rules))


@pytest.mark.parametrize(
    ("filter_subject", "prefix", "expected"),
    [
        (">", "orders.secret.", True),
        ("orders.>", "orders.secret.", True),
        ("orders.*.x", "orders.secret.", True),
        ("orders.*", "orders.secret.", False),  # one token after orders: no room for ".x"
        ("orders.*", "orders.secret", True),
        ("orders.eu.>", "orders.secret.", False),
        ("orders.secretive", "orders.secret", True),  # a prefix may end inside a token
        ("orders.secret", "orders.secret.", False),
        ("orders", "", True),
        ("*.secret.>", "orders.", True),
        ("a.b", "a..", False),
    ],
)
def test_reaches(filter_subject: str, prefix: str, expected: bool) -> None:
    assert reaches(filter_subject, prefix) is expected


def test_head_and_confined() -> None:
    assert head("orders.eu.>") == "orders.eu."
    assert head("orders.eu") == "orders.eu"
    assert head("*.eu.>", "orders.") == "orders.eu."
    assert head("orders.>", "orders.eu.") == "orders.eu."
    assert confined("orders.eu.>", "orders.eu.")
    assert not confined("orders.>", "orders.eu.")
    assert confined("*.eu.>", "orders.eu.", "orders.")
    assert not confined("orders.eu", "orders.eu.")


READER = principal(
    "reader",
    ("stream:ORDERS", ["read"]),
    ("stream:ORDERS/orders.secret.", []),
    ("consumer:ORDERS/worker-*", ["consume"]),
)


@pytest.mark.parametrize(
    ("who", "filters", "denied_by"),
    [
        (READER, ["orders.eu.>"], None),
        (READER, ["orders.secret.>"], "orders.secret."),
        (READER, [], "orders.secret."),  # no filter: the whole stream
        (READER, ["orders.*.42"], "orders.secret."),
        (READER, ["orders.eu.>", "orders.>"], "orders.secret."),
        (READER, ["orders.secretive"], None),  # does not start with "orders.secret."
        # No stream rule applies: the consumer grant alone decides.
        (principal("c", ("consumer:ORDERS/*", ["consume"])), [], None),
        # A wide deny with a narrower grant under it: the filter stays inside the grant.
        (
            principal("n", ("stream:ORDERS/orders.", []), ("stream:ORDERS/orders.eu.", ["read"])),
            ["orders.eu.>"],
            None,
        ),
        (
            principal("n", ("stream:ORDERS/orders.", []), ("stream:ORDERS/orders.eu.", ["read"])),
            ["orders.*.x"],
            "orders.",
        ),
        # A write-only rule is no read: consuming what it decides is refused.
        (principal("w", ("stream:ORDERS", ["write"])), ["orders.eu.>"], ""),
    ],
)
def test_consume_denial(who: Principal, filters: list[str], denied_by: str | None) -> None:
    denied = access.consume_denial(who, "ORDERS", filters)
    if denied_by is None:
        assert denied is None
    else:
        assert denied is not None
        assert (denied[1].pattern.prefix or "") == denied_by


def test_check_consumer_names_the_filter_and_the_rule() -> None:
    with pytest.raises(errors.Forbidden) as raised:
        access.check_consumer(READER, "ORDERS", "worker-3", ["orders.secret.>"])
    assert "'orders.secret.>'" in raised.value.detail
    assert "'stream:ORDERS/orders.secret.'" in raised.value.detail
    access.check_consumer(READER, "ORDERS", "worker-1", ["orders.eu.>"])
    access.check_delivered(READER, "ORDERS", "worker-1", "orders.eu.1")
    with pytest.raises(errors.Forbidden):
        access.check_delivered(READER, "ORDERS", "worker-1", "orders.secret.1")


def test_sees_account_and_consumers() -> None:
    admin = principal("admin", ("stream:*", ["read", "write"]))
    assert access.sees_account(admin)
    carved = principal("c", ("stream:*", ["read"]), ("stream:SECRET", []))
    assert not access.sees_account(carved)
    assert not access.sees_account(READER)
    assert access.sees_consumer(READER, "ORDERS", "worker-1")
    assert not access.sees_consumer(READER, "ORDERS", "audit")


def _message(**headers: str) -> Outgoing:
    return Outgoing("orders.eu.1", b"x", dict(headers))


def test_for_writer() -> None:
    writer = principal("writer", ("stream:ORDERS/orders.eu.", ["write"]))
    scoped = for_writer(_message(**{"Nats-Msg-Id": "m1"}), writer, "ORDERS", 1 << 20)
    assert scoped.headers["Nats-Msg-Id"] == f"{id_scope(writer)}m1"
    assert scoped.confined
    for header in ("Nats-Expected-Last-Sequence", "Nats-Expected-Last-Msg-Id"):
        with pytest.raises(errors.Forbidden, match=header):
            for_writer(_message(**{header: "1"}), writer, "ORDERS", 1 << 20)
    subject_seq = _message(**{"Nats-Expected-Last-Subject-Sequence": "1"})
    assert for_writer(subject_seq, writer, "ORDERS", 1 << 20).headers == subject_seq.headers

    whole = principal("whole", ("stream:ORDERS", ["read", "write"]))
    kept = for_writer(_message(**{"Nats-Msg-Id": "m1"}), whole, "ORDERS", 1 << 20)
    assert kept.headers == {"Nats-Msg-Id": "m1"} and not kept.confined

    # Id spaces: distinct per token name, none a prefix of another's.
    assert id_scope(writer) != id_scope(principal("writer2"))
    assert len({len(id_scope(principal(n))) for n in ("a", "bb", "a~b")}) == 1


def test_scrubbed() -> None:
    error = errors.from_jetstream(
        {"code": 400, "err_code": 10070, "description": "wrong last msg ID: acme-merger-4711"}
    )
    clean = scrubbed(error)
    assert isinstance(clean, errors.PreconditionFailed)
    assert clean.code == error.code
    assert "acme" not in str(clean.problem())
    assert clean.problem()["nats"] == {"code": 400, "err_code": 10070}


class _Session:
    """A consume session that delivers the given messages."""

    def __init__(self, msgs: list[Msg]) -> None:
        self.msgs = msgs

    async def events(self) -> AsyncIterator[Delivered]:
        for msg in self.msgs:
            yield Delivered(msg)


class _Pool:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def requests(self, requests: list[tuple[str, bytes]], **_: object) -> list[object]:
        self.sent.extend(requests)
        return [None] * len(requests)


async def test_a_consume_ends_at_a_message_the_token_may_not_read() -> None:
    """A consumer re-created with a broader filter during a consume: the denied message is
    not sent, it is nak'ed, and the event stream ends with an error event."""
    pool = _Pool()
    service = ConsumerService(pool, None, None, b"k" * 32)  # type: ignore[arg-type]

    def msg(subject: str, seq: int) -> Msg:
        reply = f"$JS.ACK.ORDERS.worker-1.1.{seq}.{seq}.1700000000000000000.0"
        return Msg(None, subject=subject, reply=reply, data=b"d")  # type: ignore[arg-type]

    allowed, denied = msg("orders.eu.1", 1), msg("orders.secret.1", 2)

    def guard(subject: str) -> None:
        access.check_delivered(READER, "ORDERS", "worker-1", subject)

    session = _Session([allowed, denied, msg("orders.eu.2", 3)])
    events = [
        event
        async for event in service._events("ORDERS", "worker-1", None, session, guard)  # type: ignore[arg-type]
    ]
    assert [e["event"] for e in events] == ["message", "error"]
    assert json.loads(events[1]["data"])["code"] == "auth.forbidden"
    assert "orders.secret.1" not in events[1]["data"]
    assert pool.sent == [(denied.reply, b"-NAK")]


def test_a_writer_of_the_whole_stream_that_reads_part_of_it_has_its_ids_scoped() -> None:
    """A matching id would answer "duplicate" with another subject's message sequence."""
    token = principal(
        "partial-reader", ("stream:ORDERS", ["write"]), ("stream:ORDERS/orders.eu.", ["read"])
    )
    scoped = for_writer(_message(**{"Nats-Msg-Id": "m1"}), token, "ORDERS", 1 << 20)
    assert scoped.headers["Nats-Msg-Id"] == f"{id_scope(token)}m1" and scoped.confined


def test_a_scoped_id_that_no_longer_fits_is_a_413() -> None:
    writer = principal("writer", ("stream:ORDERS/orders.eu.", ["write"]))
    message = _message(**{"Nats-Msg-Id": "m1"})
    for_writer(message, writer, "ORDERS", message.size + len(id_scope(writer)))
    with pytest.raises(errors.PayloadTooLarge, match="max_payload"):
        for_writer(message, writer, "ORDERS", message.size + len(id_scope(writer)) - 1)
