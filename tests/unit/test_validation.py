"""Validators: what they accept can never smuggle whitespace, CR/LF or wildcards into NATS."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import validation
from app.errors import Forbidden, InvalidInput

# Mostly ASCII with the interesting characters over-represented, plus arbitrary unicode.
hostile = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("ab.Z09-_/=*>$ \t\r\n\x00\x7f.")), st.characters(codec="utf-8")
    ),
    max_size=40,
)
WHITESPACE = set(" \t\r\n\x0b\x0c\x00")


def accepted(fn, value):  # type: ignore[no-untyped-def]
    try:
        fn(value)
    except (InvalidInput, Forbidden):
        return False
    return True


@settings(max_examples=500)
@given(hostile)
def test_literal_validators_never_accept_wildcards_or_whitespace(value: str) -> None:
    for fn in (
        validation.subject,
        validation.publish_subject,
        validation.kv_key,
        validation.stream_name,
        validation.consumer_name,
        validation.bucket_name,
    ):
        if accepted(fn, value):
            assert not WHITESPACE & set(value), (fn.__name__, value)
            assert "*" not in value and ">" not in value, (fn.__name__, value)
            assert value and not value.startswith(".") and not value.endswith("."), value
            assert ".." not in value
            assert value.isascii()


@settings(max_examples=500)
@given(hostile)
def test_names_are_single_tokens(value: str) -> None:
    for fn in (validation.stream_name, validation.consumer_name, validation.bucket_name):
        if accepted(fn, value):
            assert "." not in value and "/" not in value


@settings(max_examples=500)
@given(hostile)
def test_filters_only_use_whole_token_wildcards(value: str) -> None:
    for fn in (validation.subject_filter, validation.kv_key_filter):
        if accepted(fn, value):
            assert not WHITESPACE & set(value)
            tokens = value.split(".")
            for i, token in enumerate(tokens):
                assert token, value
                if "*" in token:
                    assert token == "*"
                if ">" in token:
                    assert token == ">" and i == len(tokens) - 1


@settings(max_examples=300)
@given(st.text(max_size=30))
def test_header_values_never_carry_line_breaks(value: str) -> None:
    if accepted(lambda v: validation.header_value("X", v), value):
        assert "\r" not in value and "\n" not in value and "\x00" not in value


@pytest.mark.parametrize(
    ("fn", "good", "bad"),
    [
        (
            validation.stream_name,
            ["ORDERS", "a-b_c", "x" * 255],
            ["", "a.b", "a b", "a\n", "x" * 256, "*"],
        ),
        (
            validation.subject,
            ["a", "a.b.c", "$KV.b.k", "a-b/c=d"],
            ["", "a.", ".a", "a..b", "a.*", "a.>", "a b", "a\n"],
        ),
        (
            validation.subject_filter,
            ["a.*", "a.>", ">", "*.b"],
            ["a.>.b", "a*", "a.b>", "", "a. b"],
        ),
        (
            validation.kv_key,
            ["k", "a.b", "a/b=c_d-e", "1234.name"],
            ["", ".a", "a.", "a..b", "a*", "a>", "a b", "k\n"],
        ),
        (validation.kv_key_filter, ["a.*", ">", "a.>", "1234.*"], ["a.>.b", "a*", "", "a b"]),
        (validation.bucket_name, ["USERS", "a_b-c"], ["a.b", "", "a b", "a\n"]),
    ],
)
def test_examples(fn, good, bad) -> None:  # type: ignore[no-untyped-def]
    for value in good:
        assert fn(value) == value
    for value in bad:
        with pytest.raises(InvalidInput):
            fn(value)


def test_reserved_publish_subjects() -> None:
    for value in ["$JS.API.INFO", "$JS.ACK.a.b", "$SYS.x", "_INBOX.x", "$FOO.x", "$NRG.x"]:
        with pytest.raises(Forbidden) as info:
            validation.publish_subject(value)
        assert info.value.code == "subject.reserved"
    assert validation.publish_subject("$KV.bucket.key") == "$KV.bucket.key"


def test_kv_reserved_prefix_only_on_write() -> None:
    assert validation.kv_key("_kv.x") == "_kv.x"
    with pytest.raises(InvalidInput):
        validation.kv_key("_kv.x", writing=True)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "", str(2**64), " 1"])
def test_bad_sequences(value: str) -> None:
    with pytest.raises(InvalidInput):
        validation.sequence(value)


def test_good_sequence() -> None:
    assert validation.sequence("42") == 42
    assert validation.sequence(2**64 - 1) == 2**64 - 1


def test_lengths_keep_nats_protocol_lines_short() -> None:
    # KV_<bucket> is a stream name (255 at most); keys and subjects go into protocol lines
    # that nats-server cuts off (with the whole connection) past 4096 bytes.
    assert validation.bucket_name("b" * 252)
    for fn, long in [
        (validation.bucket_name, "b" * 253),
        (validation.kv_key, "k" * 2049),
        (validation.kv_key_filter, "k" * 2049),
        (validation.subject, "s" * 2049),
        (validation.subject_filter, "s" * 2049),
    ]:
        assert not accepted(fn, long), fn
    assert validation.kv_key("k" * 2048) and validation.subject("s" * 2048)


# -- each validator is its schema in the OpenAPI document -----------------------------------

_VALIDATORS = {
    "stream": validation.stream_name,
    "consumer": validation.consumer_name,
    "bucket": validation.bucket_name,
    "group": validation.group_name,
    "pin_id": validation.pin_id,
    "key": validation.kv_key,
    "written_key": lambda value: validation.kv_key(value, writing=True),
    "key_filter": validation.kv_key_filter,
    "subject": validation.subject,
    "subject_filter": validation.subject_filter,
    "header_name": validation.header_name,
    "header_value": lambda value: validation.header_value("X", value),
}
_TRICKY = st.text(
    st.one_of(st.sampled_from(list("aZ09-_/=.*>$ _kv\t\r\n\x00\x7f{}%:")), st.characters()),
    max_size=24,
)


def _in_schema(kind: str, value: str) -> bool:
    schema = validation.SCHEMAS[kind]
    return (
        re.fullmatch(str(schema["pattern"]), value) is not None
        and int(schema.get("minLength", 0)) <= len(value)
        and len(value) <= int(schema.get("maxLength", 10**9))
    )


@pytest.mark.parametrize("kind", sorted(_VALIDATORS))
@settings(max_examples=300)
@given(data=st.data())
def test_validators_accept_exactly_their_schema(kind: str, data: st.DataObject) -> None:
    pattern = str(validation.SCHEMAS[kind]["pattern"])
    value = data.draw(st.one_of(st.from_regex(pattern, fullmatch=True), _TRICKY))
    assert accepted(_VALIDATORS[kind], value) == _in_schema(kind, value), (kind, value)


def test_every_schema_with_a_pattern_has_its_validator_here() -> None:
    patterned = {kind for kind, schema in validation.SCHEMAS.items() if "pattern" in schema}
    assert patterned == set(_VALIDATORS)
