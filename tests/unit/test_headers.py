"""NATS header blocks: the status line and every value of every name, as the server wrote them."""

from __future__ import annotations

import pytest

from app.nats.headers import parse

CASES = [
    (
        b"NATS/1.0\r\nNats-Sequence: 12\r\nX: 1\r\nX:  2 \r\nx: 3\r\n\r\n",
        (None, "", {"Nats-Sequence": ["12"], "X": ["1", "2"], "x": ["3"]}),
    ),
    (b"NATS/1.0 404 Message Not Found\r\n\r\n", (404, "Message Not Found", {})),
    (b"NATS/1.0  503  \r\n\r\n", (503, "", {})),
    ("NATS/1.0 ٣ x\r\n".encode(), (None, "", {})),  # a status is ASCII digits
    (b"NATS/1.0\xc2\xa0404 x\r\n", (None, "", {})),  # only ASCII space around the status
    ("NATS/1.0 408 Bad\u00a0\r\n".encode(), (408, "Bad", {})),
    (
        b"NATS/1.0\r\nK\xff: v\xe2\x82\r\nno colon\r\n: empty\r\n",
        (None, "", {"K\ufffd": ["v\ufffd"], "": ["empty"]}),
    ),
    (b"garbage\r\nA: b", (None, "", {"A": ["b"]})),
    (b"", (None, "", {})),
    (None, (None, "", {})),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_parse(raw: bytes | None, expected: tuple[object, ...]) -> None:
    block = parse(raw)
    assert (block.status, block.description, block.values) == expected
