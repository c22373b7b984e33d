from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import errors
from app.nats import acks

SECRET = b"s" * 32
REPLY = "$JS.ACK.ORDERS.workers.3.1042.17.1795357640842857477.5"
REPLY_V2 = "$JS.ACK.hub.ACCHASH.ORDERS.workers.3.1042.17.1795357640842857477.5.XYZ"


def _raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _token(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize("reply", [REPLY, REPLY_V2])
def test_round_trip_and_metadata(reply: str) -> None:
    token = acks.sign(SECRET, "ORDERS", "workers", reply)
    subject = acks.verify(SECRET, "ORDERS", "workers", token)
    assert subject.subject == reply
    assert (subject.stream, subject.consumer) == ("ORDERS", "workers")
    assert (subject.delivered, subject.stream_seq, subject.consumer_seq) == (3, 1042, 17)
    assert (subject.timestamp_ns, subject.pending) == (1795357640842857477, 5)


def test_bound_to_stream_and_consumer() -> None:
    token = acks.sign(SECRET, "ORDERS", "workers", REPLY)
    with pytest.raises(errors.Forbidden) as foreign:
        acks.verify(SECRET, "ORDERS", "auditors", token)
    assert foreign.value.code == "ack.token_foreign"
    with pytest.raises(errors.Forbidden):
        acks.verify(SECRET, "INVOICES", "workers", token)


def test_other_secret_is_a_forgery() -> None:
    token = acks.sign(b"another gateway's secret", "ORDERS", "workers", REPLY)
    with pytest.raises(errors.InvalidInput) as forged:
        acks.verify(SECRET, "ORDERS", "workers", token)
    assert forged.value.code == "ack.token_invalid"


def test_a_signed_subject_of_another_consumer_is_never_accepted() -> None:
    # Even a correctly signed token fails when the subject inside names another consumer.
    token = acks.sign(SECRET, "ORDERS", "workers", REPLY.replace(".workers.", ".other."))
    with pytest.raises(errors.InvalidInput):
        acks.verify(SECRET, "ORDERS", "workers", token)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "x",
        "not base64!",
        "AAAA",
        "A" * 2000,
        acks.sign(SECRET, "ORDERS", "workers", REPLY) + "\n",  # a trailing newline
        _token(b"\x02" + REPLY.encode() + b"m" * 32),
    ],  # another token version
)
def test_malformed_tokens(token: str) -> None:
    with pytest.raises(errors.InvalidInput) as bad:
        acks.verify(SECRET, "ORDERS", "workers", token)
    assert bad.value.code == "ack.token_invalid"


@given(st.data())
def test_any_single_byte_change_is_rejected(data: st.DataObject) -> None:
    raw = bytearray(_raw(acks.sign(SECRET, "ORDERS", "workers", REPLY)))
    index = data.draw(st.integers(0, len(raw) - 1))
    flip = data.draw(st.integers(1, 255))
    raw[index] ^= flip
    with pytest.raises((errors.InvalidInput, errors.Forbidden)):
        acks.verify(SECRET, "ORDERS", "workers", _token(bytes(raw)))


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.S.C.1.2.3.4",  # too few tokens
        "$JS.ACK.S.C.1.2.3.4.5.6",  # 10 tokens: neither form
        "$JS.ACK.S.C.1.2.x.4.5",
        "$JS.NAK.S.C.1.2.3.4.5",
        "$JS.ACK.S C.C.1.2.3.4.5",
        "$JS.ACK.S.C.1.2.3.4.5\r\n",
        "$JS.ACK.S.C.1.2.3.4.-5",
        "$JS.ACK.S.*.1.2.3.4.5",
        "$JS.ACK.S..1.2.3.4.5",
    ],
)
def test_unparseable_ack_subjects(subject: str) -> None:
    assert acks.parse_ack_subject(subject) is None
