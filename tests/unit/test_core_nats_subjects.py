"""Core NATS subjects and queue names, and subject: rules of the auth file."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.auth import access
from app.auth.policy import SUBJECTS, Pattern, PolicyError, Principal, Resource, Rule, parse_pattern
from app.auth.review import explain, parse_resource, rule_text
from app.corenats import subjects
from app.errors import ErrorCode, Forbidden, InvalidInput


@pytest.mark.parametrize(
    "subject",
    ["$JS.API.INFO", "$KV.b.k", "$O.b.C.x", "$SYS.x", "$SRV.PING", "$", "$x", "_INBOX.a",
     "_INBOX", "_R_.a", "_GR_.a"],
)  # fmt: skip
def test_reserved_subjects(subject: str) -> None:
    for check in (subjects.literal, subjects.subscription):
        with pytest.raises(InvalidInput) as raised:
            check(subject)
        assert raised.value.code is ErrorCode.NATS_SUBJECT_RESERVED


@pytest.mark.parametrize("subject", ["orders", "orders.eu.1", "_INBOXES.x", "a$.b", "INBOX.x"])
def test_allowed_subjects(subject: str) -> None:
    assert subjects.literal(subject) == subject
    assert subjects.subscription(subject) == subject


def test_wildcards_only_where_allowed() -> None:
    for wild in ("a.*", "a.>", "a.*.b"):
        with pytest.raises(InvalidInput) as raised:
            subjects.literal(wild)
        assert raised.value.code is ErrorCode.SUBJECT_INVALID
        assert subjects.subscription(wild) == wild
    for first in (">", "*", "*.a", "*.>"):
        with pytest.raises(InvalidInput) as raised:
            subjects.subscription(first)
        assert raised.value.code is ErrorCode.NATS_SUBJECT_RESERVED


@given(st.text(max_size=40))
def test_anything_a_subscription_takes_starts_with_an_unreserved_literal(text: str) -> None:
    try:
        subjects.subscription(text)
    except InvalidInput:
        return
    first = text.split(".", 1)[0]
    assert first not in ("*", ">") and not first.startswith("$")
    assert first not in subjects.RESERVED_TOKENS
    assert not any(c.isspace() for c in text)


@pytest.mark.parametrize("queue", ["", " ", "a b", "q\n", "x" * 129, "a*", "a>"])
def test_bad_queue_names(queue: str) -> None:
    with pytest.raises(InvalidInput):
        subjects.queue(queue)


def test_subject_patterns() -> None:
    assert parse_pattern("subject:*") == Pattern("subject", SUBJECTS, None)
    assert parse_pattern("subject:orders.eu.") == Pattern("subject", SUBJECTS, "orders.eu.")
    with pytest.raises(PolicyError):
        parse_pattern("subject:")
    rule = Rule(parse_pattern("subject:orders."), frozenset({"read"}))
    assert rule_text(rule) == "subject:orders. [read]"
    assert str(Resource("subject", SUBJECTS, "orders.eu.1")) == "subject:orders.eu.1"
    assert parse_resource("subject:orders.eu.1") == Resource("subject", SUBJECTS, "orders.eu.1")


def _principal(*rules: tuple[str, set[str]]) -> Principal:
    return Principal("t", tuple(Rule(parse_pattern(r), frozenset(a)) for r, a in rules))


def test_most_specific_subject_rule_decides_default_deny() -> None:
    p = _principal(
        ("subject:*", {"write"}),
        ("subject:orders.", {"read", "write"}),
        ("subject:orders.secret", set()),
    )
    on = lambda s: Resource("subject", SUBJECTS, s)  # noqa: E731
    assert p.allows("read", on("orders.eu.1"))
    assert not p.allows("read", on("orders.secret.1"))
    assert not p.allows("write", on("orders.secret.1"))
    assert p.allows("write", on("other.x"))
    assert not p.allows("read", on("other.x"))
    assert explain(p, "read", on("orders.secret.x")).decisive[1].pattern.prefix == (  # type: ignore[index]
        "orders.secret"
    )
    # subject: rules are about core NATS only: stream and kv rules grant nothing there.
    streams = _principal(("stream:*", {"read", "write"}), ("kv:*", {"read", "write"}))
    assert not streams.allows("read", on("orders.x"))


def test_subject_reader_narrows_or_refuses() -> None:
    p = _principal(("subject:orders.eu.", {"read"}), ("subject:orders.eu.secret", set()))
    assert access.subject_reader(Principal("anon", anonymous=True), "orders.>") is None
    visible = access.subject_reader(p, "orders.>")
    assert visible is not None
    assert visible("orders.eu.1") and not visible("orders.us.1")
    assert not visible("orders.eu.secret.1") and not visible("orders.europe.1")
    visible = access.subject_reader(p, "orders.eu.*")
    assert visible is not None and not visible("orders.eu.secret")
    for nothing in ("orders.us.>", "orders.eu.secret.>", "other"):
        with pytest.raises(Forbidden):
            access.subject_reader(p, nothing)
    with pytest.raises(Forbidden):
        access.subject_reader(p, "orders.>", whole=True)
    assert access.subject_reader(p, "orders.eu.1", whole=True) is None
    assert access.subject_reader(_principal(("subject:*", {"read"})), "a.>", whole=True) is None


@given(
    st.one_of(
        st.text(max_size=30),
        st.from_regex(r"[$_*>a-zA-Z.\n]{1,12}", fullmatch=True),
        st.sampled_from(["_INBOX", "_INBOX.a", "_INBOXa", "$", "a.$", "*.a", "a.*", ">", "a\n"]),
    )
)
def test_the_validators_accept_exactly_their_schema(text: str) -> None:
    for check, schema in (
        (subjects.literal, subjects.SUBJECT_SCHEMA),
        (subjects.subscription, subjects.FILTER_SCHEMA),
    ):
        try:
            check(text)
            accepted = True
        except InvalidInput:
            accepted = False
        # ("$" of ECMA-262 is Python's "\Z": a trailing newline does not pass)
        pattern = schema["pattern"].removesuffix("$") + r"\Z"
        stated = re.search(pattern, text) is not None and len(text) <= schema["maxLength"]
        assert accepted == stated, (check.__name__, text)


async def test_a_subject_that_is_not_text_is_dropped_not_raised() -> None:
    """nats-server delivers subjects of any bytes (a raw PUB of ``bin.\\xff`` reaches a
    ``bin.>`` subscriber); the subscription's callback runs on the connection's reading loop,
    so it must neither raise (which breaks that loop) nor pass the message on."""
    from app.corenats.subscription import Subscription

    sub = Subscription(max_messages=10, max_bytes=1024)
    sub.on_message(b"bin.\xff\xfe", None, b"x")
    sub.on_message(b"bin.ok", None, b"y")
    assert sub.filtered == 1 and not sub.ended
    events = sub.events()
    first = await anext(events)
    assert first["event"] == "message" and '"subject":"bin.ok"' in first["data"]
    sub.stop()
    await events.aclose()
