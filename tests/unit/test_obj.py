"""Object buckets' pure parts: ranges, names, digests, the meta message codec (ADR-20)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import errors
from app.obj import model
from app.obj.ranges import span_of
from app.obj.service import Span


@pytest.mark.parametrize(
    ("header", "size", "span"),
    [
        ("bytes=0-9", 100, Span(0, 9)),
        ("bytes=90-200", 100, Span(90, 99)),
        ("bytes=-10", 100, Span(90, 99)),
        ("bytes=-1000", 100, Span(0, 99)),
        ("bytes=50-", 100, Span(50, 99)),
        ("Bytes = 1 - 2", 100, Span(1, 2)),
        (None, 100, None),
        ("bytes=5-1", 100, None),  # invalid: ignored
        ("bytes=0-1,4-5", 100, None),  # several: the whole object
        ("lines=1-2", 100, None),
        ("bytes=-", 100, None),
    ],
)
def test_ranges(header: str | None, size: int, span: Span | None) -> None:
    assert span_of(header, size) == span


@pytest.mark.parametrize(
    ("header", "size"), [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=-5", 0), ("bytes=0-0", 0)]
)
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(errors.RangeNotSatisfiable) as raised:
        span_of(header, size)
    assert raised.value.headers == {"Content-Range": f"bytes */{size}"}


@given(st.text(max_size=40), st.integers(min_value=0, max_value=10**12))
def test_a_range_is_inside_the_object_or_refused(header: str, size: int) -> None:
    try:
        span = span_of(header, size)
    except errors.RangeNotSatisfiable:
        return
    if span is not None:
        assert 0 <= span.start <= span.end < size


@given(st.text(min_size=1, max_size=600))
def test_names_go_into_one_subject_token(name: str) -> None:
    try:
        model.object_name(name)
    except errors.InvalidInput:
        assert any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > 512
        return
    subject = model.meta_subject("B", name)
    token = subject.removeprefix("$O.B.M.")
    assert "." not in token and " " not in token and "*" not in token and ">" not in token
    assert model.decode_name(token) == name
    assert len(f"$JS.API.DIRECT.GET.OBJ_{'B' * 251}.$O.{'B' * 251}.M.{token}") < 3500


def test_digest_as_nats_py_spells_it() -> None:
    sha = hashlib.sha256(b"abc").digest()
    digest = model.digest_of(sha)
    assert digest == "SHA-256=" + base64.urlsafe_b64encode(sha).decode()
    assert model.digest_bytes(digest) == sha
    assert model.digest_bytes("sha-256=" + digest[8:]) == sha
    assert model.digest_bytes("MD5=abc") is None and model.digest_bytes("SHA-256=!!") is None


def test_meta_message_round_trip_and_go_headers() -> None:
    info = model.ObjectInfo(
        bucket="B",
        name="a/b",
        nuid="N",
        size=3,
        chunks=1,
        digest="SHA-256=x",
        mtime="2026-01-01T00:00:00Z",
        headers={"Content-Type": ["text/plain"]},
        metadata={"owner": "ann"},
        max_chunk_size=model.CHUNK_SIZE,
    )
    wire = json.loads(info.wire())
    assert wire["options"] == {"max_chunk_size": model.CHUNK_SIZE} and "deleted" not in wire
    back = model.parse_info(info.wire(), 7)
    assert (back.name, back.size, back.headers, back.metadata, back.seq) == (
        "a/b",
        3,
        {"Content-Type": ["text/plain"]},
        {"owner": "ann"},
        7,
    )
    # nats-py writes headers as it was given them (plain strings): read as lists.
    assert model.parse_info(b'{"name":"x","headers":{"A":"1"}}').headers == {"A": ["1"]}


@pytest.mark.parametrize("data", [b"", b"[]", b"{}", b'{"name": "x", "size": "big"}', b"\xff"])
def test_bad_meta_is_a_502(data: bytes) -> None:
    with pytest.raises(errors.UpstreamError):
        model.parse_info(data)
