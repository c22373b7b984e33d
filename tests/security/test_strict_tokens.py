"""Signed tokens have one spelling: any other string that a lenient base64 decoder would read as
the same bytes is refused (SSE tokens 401, ack tokens 400). No server needed.

Python's ``base64`` skips characters outside the alphabet and ignores the unused bits of the
last character; without the strict decoder (app/b64url.py) ``<body>.<mac[:5]>!!~~<mac[5:]>``
was the same SSE token, and a last character off by one the same ack token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import b64url, errors
from app.auth.guard import Authenticator
from app.auth.policy import Policy, Principal
from app.nats import acks

SECRET = b"s" * 32
REPLY = "$JS.ACK.ORDERS.workers.3.1042.17.1795357640842857477.5"
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
POLICY = """
tokens:
  - name: app
    token: "app-token-0123456789ab"
    rules:
      - {resource: "kv:*", actions: [read]}
"""


def lenient(text: str) -> bytes | None:
    """What Python's default decoder makes of ``text`` (None: it refuses it)."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def respellings(token: str) -> list[str]:
    """Strings other than ``token`` that the lenient decoder reads as the same bytes."""
    body, _, mac = token.rpartition(".")
    prefix = body + "." if body else ""
    out = [
        prefix + mac[:5] + "!!~~" + mac[5:],
        prefix + mac + "==",
        prefix + mac + "=",
        prefix + mac[:3] + " " + mac[3:],
        prefix + mac[:3] + "\n" + mac[3:],
        prefix + mac + "\n",
        prefix + mac[:4] + "=" + mac[4:],
        prefix + mac[:7] + "%" + mac[7:],
    ]
    if body:
        out.append(body[:2] + "!!" + body[2:] + "." + mac)
    # The unused low bits of the last character: 4 of them when len % 4 == 2, 2 when 3.
    unused = {2: 4, 3: 2}.get(len(mac) % 4, 0)
    last = ALPHABET.index(mac[-1])
    out += [
        prefix + mac[:-1] + ALPHABET[last | bits]
        for bits in range(1, 1 << unused)
        if last | bits != last
    ]
    return [text for text in out if text != token]


# -- the decoder -----------------------------------------------------------------------------


@given(st.binary(max_size=200))
def test_round_trip(raw: bytes) -> None:
    assert b64url.decode(b64url.encode(raw)) == raw


@given(st.text(alphabet=ALPHABET + "=+/.!~ \n", max_size=40))
def test_a_decoded_string_is_the_canonical_encoding(text: str) -> None:
    try:
        raw = b64url.decode(text)
    except ValueError:
        return
    assert b64url.encode(raw) == text


@pytest.mark.parametrize("text", ["A", "AB==", "AB=", "A B", "AB\n", "AB+/", "AB!", "AF", "AAB"])
def test_non_canonical_strings_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        b64url.decode(text)


# -- SSE tokens ------------------------------------------------------------------------------


@pytest.fixture
def authenticator(tmp_path: Path) -> Authenticator:
    path = tmp_path / "auth.yaml"
    path.write_text(POLICY)
    return Authenticator(path, b"sse-secret")


def _sse_token(authenticator: Authenticator) -> str:
    assert authenticator.policy is not None
    principal = authenticator.policy.authenticate("app-token-0123456789ab")
    assert principal is not None
    token, _ = authenticator.mint_sse_token(principal, ttl=60)
    return token


def test_sse_token_respellings_are_refused(authenticator: Authenticator) -> None:
    token = _sse_token(authenticator)
    assert authenticator.authenticate(None, token).name == "app"
    variants = respellings(token)
    assert len(variants) >= 9
    for variant in variants:
        body, _, mac = variant.rpartition(".")
        if lenient(body) is not None and lenient(mac) is not None:
            # The case: the lenient decoder reads this as the genuine token.
            assert (lenient(body), lenient(mac)) == tuple(map(lenient, token.split(".")))
        with pytest.raises(errors.Unauthorized):
            authenticator.authenticate(None, variant)


@given(st.data())
def test_sse_token_with_any_inserted_character_is_refused(data: st.DataObject) -> None:
    authenticator = Authenticator(None, b"x")  # policy set below: no file needed
    authenticator.policy = _policy()
    token = _sse_token(authenticator)
    index = data.draw(st.integers(0, 200)) % (len(token) + 1)  # the length varies with time
    char = data.draw(st.characters(codec="ascii").filter(lambda c: c not in ALPHABET))
    variant = token[:index] + char + token[index:]
    with pytest.raises(errors.Unauthorized):
        authenticator.authenticate(None, variant)


def _policy() -> Policy:
    digest = hashlib.sha256(b"app-token-0123456789ab").digest()
    return Policy(by_digest={digest: Principal("app")})


# -- ack tokens ------------------------------------------------------------------------------


def test_ack_token_respellings_are_refused() -> None:
    token = acks.sign(SECRET, "ORDERS", "workers", REPLY)
    assert acks.verify(SECRET, "ORDERS", "workers", token).subject == REPLY
    variants = respellings(token)
    assert variants
    lenient_same = 0
    for variant in variants:
        if lenient(variant) == lenient(token):
            lenient_same += 1
        with pytest.raises(errors.InvalidInput) as refused:
            acks.verify(SECRET, "ORDERS", "workers", variant)
        assert refused.value.code == "ack.token_invalid"
    assert lenient_same >= 1  # at least one would have been the same token before


@given(st.text(alphabet=ALPHABET, min_size=1, max_size=3))
def test_ack_tokens_of_every_length_have_one_spelling(reply_tail: str) -> None:
    # Replies of different lengths give every len % 4 of the token, so unused bits occur.
    token = acks.sign(SECRET, "ORDERS", "workers", REPLY + reply_tail)
    for variant in respellings(token):
        with pytest.raises(errors.InvalidInput):
            acks.verify(SECRET, "ORDERS", "workers", variant)
