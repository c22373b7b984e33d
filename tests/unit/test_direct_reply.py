"""A single Direct Get's reply read in one pass gives what the parsed header block gives."""

from __future__ import annotations

import random

import pytest

from app import errors
from app.nats import direct
from app.nats.direct import StoredMessage, _from_direct_reply
from app.nats.replies import Reply

CANONICAL = (
    b"NATS/1.0\r\nNats-Stream: KV_b\r\nNats-Subject: $KV.b.k1\r\nNats-Sequence: 12\r\n"
    b"Nats-Time-Stamp: 2026-11-22T21:36:31.123456789Z\r\n\r\n"
)


def _slow(raw: bytes | None, data: bytes) -> StoredMessage | type[Exception]:
    """The header block parsed whole, as every reply was read before."""
    reply = Reply(raw, data)
    block = reply.headers
    if block.status is not None:
        return type(direct._status_error(block.status, block.description))
    return StoredMessage(
        stream=block.first("Nats-Stream") or "",
        subject=block.first("Nats-Subject") or "",
        seq=int(seq)
        if (seq := block.first("Nats-Sequence")) and seq.isascii() and seq.isdigit()
        else 0,
        time=block.first("Nats-Time-Stamp"),
        headers={k: v for k, v in block.values.items() if k not in direct.META_HEADERS},
        data=data,
    )


def _fast(raw: bytes | None, data: bytes) -> StoredMessage | type[Exception]:
    try:
        return _from_direct_reply(Reply(raw, data))
    except errors.GatewayError as exc:
        return type(exc)


CASES = [
    CANONICAL,
    CANONICAL.replace(b"\r\n\r\n", b"\r\nKV-Operation: DEL\r\nX: 1\r\nX: 2\r\n\r\n"),
    CANONICAL.replace(b"Nats-Sequence", b"nats-sequence"),  # another spelling: the slow way
    CANONICAL.replace(b"Nats-Time-Stamp", b"nats-time-stamp"),
    CANONICAL.replace(b": 12", ": ²".encode()),  # not a sequence, and no ValueError
    CANONICAL.replace(b"Nats-Sequence: 12\r\n", b""),
    CANONICAL.replace(b": 12", b": 1x"),  # no sequence
    CANONICAL.replace(b"Nats-Time-Stamp", b"Other"),
    CANONICAL.replace(b"Nats-Stream: KV_b", b"Nats-Stream: KV_b\r\nNats-Stream: again"),
    CANONICAL.replace(b": ", b":  \t"),
    CANONICAL.replace(b"$KV.b.k1", "$KV.b.ключ".encode()),
    CANONICAL.replace(b"$KV.b.k1", b"$KV.b.\xff\xfe"),
    b"NATS/1.0 404 Message Not Found\r\n\r\n",
    b"NATS/1.0 408 Bad Request\r\n\r\n",
    b"NATS/1.0 503\r\n\r\n",
    b"NATS/1.0 \r\n" + CANONICAL[10:],
    b"",
    None,
]


@pytest.mark.parametrize("raw", CASES)
def test_the_same_message_or_error(raw: bytes | None) -> None:
    assert _fast(raw, b"value") == _slow(raw, b"value")


def test_random_blocks() -> None:
    rnd = random.Random(3)
    pieces = [
        b"NATS/1.0",
        b" 404 x",
        b"\r\n",
        b"Nats-Stream",
        b"Nats-Subject",
        b"Nats-Sequence",
        b": ",
        b":",
        b"KV_b",
        b"12",
        b" ",
        b"\t",
        b"nats-stream",
        b"X",
        b"\xff",
        b"Nats-Time-Stamp",
        b"nats-time-stamp",
        b"2026-11-22T21:36:31Z",
    ]
    for _ in range(20_000):
        raw = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 24)))
        if rnd.random() < 0.5:
            raw = CANONICAL[:-2] + raw
        assert _fast(raw, b"") == _slow(raw, b""), raw


def test_the_server_s_common_reply_takes_the_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(_: Reply) -> None:
        raise AssertionError("the header block was parsed")

    monkeypatch.setattr(Reply, "headers", property(parsed))
    message = _from_direct_reply(Reply(CASES[1], b"v"))
    assert (message.subject, message.seq, message.headers) == (
        "$KV.b.k1",
        12,
        {"KV-Operation": ["DEL"], "X": ["1", "2"]},
    )
    assert Reply(CANONICAL, b"v").status is None  # nor for its status
