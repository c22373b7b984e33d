"""Unpadded URL-safe base64 for the gateway's signed tokens (SSE tokens, ack tokens), decoded
strictly: one string per byte string.

Python's decoder skips characters outside the alphabet and ignores the unused low bits of the
last character, so ``<body>.<mac[:5]>!!~~<mac[5:]>`` or a last character off by one decoded as
the same token. A token is opaque and must have one spelling: a cache, a log or a deny list
keyed by the string would otherwise miss its variants.
"""

from __future__ import annotations

import base64
import binascii
import re

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")
_VALUES = {
    c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
}
_UNUSED_BITS = (0, 0, 0x0F, 0x03)  # by the length mod 4 (1 is no length an encoding has)


def encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(text: str) -> bytes:
    """The bytes ``text`` is the canonical encoding of; ValueError for anything else
    (characters outside ``A-Za-z0-9_-``, padding, a length no encoding has, unused bits set)."""
    if _ALPHABET.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("not unpadded URL-safe base64")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not unpadded URL-safe base64") from None
    # The canonical encoding leaves the last character's unused low bits zero (4 of them
    # after 1 byte of a group, 2 after 2): checked on that character rather than by encoding
    # the bytes again (ack tokens are decoded by the hundred per request).
    unused = _UNUSED_BITS[len(text) % 4]
    if unused and _VALUES[text[-1]] & unused:
        raise ValueError("not the canonical encoding (unused bits set)")
    return raw
