"""Batch replies read raw give what nats-py's message path gave: the same header dict
(:func:`app.nats.headers.folded` against nats-py's own ``_process_headers``), and the common
reply's one-match read the same message as the folded one."""

from __future__ import annotations

import random

import pytest
from nats.aio.client import Client

from app.nats.direct import _batch_message, _plain_message
from app.nats.headers import folded

_NAMES = [
    b"Nats-Stream",
    b"Nats-Subject",
    b"Nats-Sequence",
    b"Nats-Num-Pending",
    b"Status",
    b"Description",
    b"X-Trace",
    b"x-trace",
    b" Padded ",
    b"Has Space",
    b"Tab\there",
    b"caf\xc3\xa9",
    b"\xff\xfe",
    b"Sep\x1cer",
    b"",
]
_VALUES = [
    b"v",
    b" spaced value ",
    b"\tTabbed\x0b",
    b"a:b:c",
    b"caf\xc3\xa9",
    b"bad \xff\xfe utf-8",
    b"",
    b"12",
    b"\xc2",
]


def _block(rnd: random.Random) -> bytes:
    if rnd.random() < 0.3:
        code = rnd.choice([b"204", b"404", b"408", b"503", b"20", b"abc"])
        text = rnd.choice([b"", b" EOB", b" No Messages", b" Bad: Request", b"  "])
        head = b"NATS/1.0 " + code + text + b"\r\n"
    else:
        head = b"NATS/1.0\r\n"
    lines = []
    for _ in range(rnd.randint(0, 6)):
        if rnd.random() < 0.1:
            lines.append(rnd.choice([b"no colon here", b"", b":", b"::x"]))
        else:
            sep = rnd.choice([b": ", b":", b" : ", b":\t"])
            lines.append(rnd.choice(_NAMES) + sep + rnd.choice(_VALUES))
    return head + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


async def test_folded_is_the_dict_nats_py_makes() -> None:
    client = Client()
    rnd = random.Random(19)
    fixed = [
        b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 5\r\n\r\n",
        b"NATS/1.0 404 No Messages\r\n\r\n",
        b"NATS/1.0\r\n\r\n",
        b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n",
    ]
    compared = 0
    for raw in fixed + [_block(rnd) for _ in range(3000)]:
        try:
            expected = await client._process_headers(raw)
        except UnicodeDecodeError:
            continue  # (nats-py fails on a status text that is not UTF-8; the server sends none)
        assert folded(raw) == (expected or {}), raw
        compared += 1
    assert compared > 2500


def _plain(rnd: random.Random) -> bytes:
    def value() -> bytes:
        return rnd.choice([b"S", b"$KV.b.k1", b"a b", b"caf\xc3\xa9", b"\xff", b"x:y", b""])

    def number() -> bytes:
        return rnd.choice([b"0", b"1", b"18446744073709551615", b"007", b"x", b""])

    return (
        b"NATS/1.0\r\nNats-Stream: %b\r\nNats-Subject: %b\r\nNats-Sequence: %b\r\n"
        b"Nats-Time-Stamp: %b\r\nNats-Num-Pending: %b\r\nNats-Last-Sequence: %b\r\n\r\n"
        % (value(), value(), number(), value(), number(), number())
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_common_reply_read_at_once_is_the_folded_one(seed: int) -> None:
    rnd = random.Random(seed)
    matched = 0
    for _ in range(2000):
        raw = _plain(rnd)
        fast = _plain_message(raw, b"data")
        if fast is not None:
            matched += 1
            assert fast == _batch_message(folded(raw), b"data"), raw
    assert matched > 100  # (the common form came up, not only the others)
