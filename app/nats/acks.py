"""Ack tokens: a delivered message's ``$JS.ACK`` reply subject, signed and bound to its consumer.

An HTTP client acks a message by handing back the token it got with it. The token carries the
reply subject the server chose, with an HMAC-SHA256 (key ``JSGW_ACK_SECRET``) over the stream,
the consumer and that subject. So a client can only ack what a gateway sharing the secret
delivered from that consumer, can never make the gateway publish to a subject of its choosing,
and any replica can verify a token another one issued: no server-side session state.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from app import b64url, errors
from app.errors import ErrorCode

MAX_TOKEN_LENGTH = 1024
_VERSION = b"\x01"
_MAC_SIZE = hashlib.sha256().digest_size
_CONTEXT = b"jsgw-ack-v1"
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
# A subject token as the server writes names into ack subjects: printable, no separators.
_NAME = r"[!-)+-\-/-=?-~]+"
_NUMBERS = r"\.([0-9]{1,20})" * 5
# Both forms in one pattern (one match per subject, not one per token: the subject of every
# message a fetch delivers and of every ack is read with it): 9 tokens, or 11 and more.
_ACK_SUBJECT = re.compile(
    rf"\$JS\.ACK\.(?:({_NAME})\.({_NAME}){_NUMBERS}"
    rf"|{_NAME}\.{_NAME}\.({_NAME})\.({_NAME}){_NUMBERS}(?:\.{_NAME})*)"
)


@dataclass(frozen=True, slots=True)
class AckSubject:
    """The metadata the server encodes in an ack reply subject."""

    subject: str
    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    pending: int


def parse_ack_subject(subject: str) -> AckSubject | None:
    """``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>``, or the v2 form
    ``$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<the same five>[.<more>]``."""
    match = _ACK_SUBJECT.fullmatch(subject)
    if match is None:
        return None
    groups = match.groups()
    if groups[0] is not None:
        stream, consumer, *numbers = groups[:7]
    else:
        stream, consumer, *numbers = groups[7:]
    delivered, stream_seq, consumer_seq, timestamp, pending = map(int, numbers)
    return AckSubject(
        subject, stream, consumer, delivered, stream_seq, consumer_seq, timestamp, pending
    )


def _mac(secret: bytes, stream: str, consumer: str, body: bytes) -> bytes:
    message = b"\0".join((_CONTEXT, stream.encode(), consumer.encode(), body))
    # (the one-shot form: the same HMAC-SHA256, without an HMAC object per token)
    return hmac.digest(secret, message, "sha256")


def sign(secret: bytes, stream: str, consumer: str, reply: str) -> str:
    """The opaque token for a message delivered from ``stream``/``consumer`` with ``reply``."""
    body = _VERSION + reply.encode()
    raw = body + _mac(secret, stream, consumer, body)
    return b64url.encode(raw)


def verify(secret: bytes, stream: str, consumer: str, token: str) -> AckSubject:
    """The ack subject in ``token``, if this gateway signed it for this stream and consumer.

    Raises 400 ``ack.token_invalid`` for a malformed or forged token and 403
    ``ack.token_foreign`` for a genuine token of another consumer. Nothing is published.
    """
    body, mac = _decode(token)
    if hmac.compare_digest(mac, _mac(secret, stream, consumer, body)):
        parsed = parse_ack_subject(body[1:].decode("ascii", "replace"))
        # A signed subject is one the server sent; re-checked anyway before it is published to.
        if parsed is not None and (parsed.stream, parsed.consumer) == (stream, consumer):
            return parsed
        raise _invalid()
    parsed = parse_ack_subject(body[1:].decode("ascii", "replace"))
    if parsed is not None and hmac.compare_digest(
        mac, _mac(secret, parsed.stream, parsed.consumer, body)
    ):
        raise errors.Forbidden(
            ErrorCode.ACK_TOKEN_FOREIGN,
            "this ack token belongs to another stream or consumer; ack it through that one",
        )
    raise _invalid()


def _decode(token: str) -> tuple[bytes, bytes]:
    if len(token) > MAX_TOKEN_LENGTH or _TOKEN.fullmatch(token) is None:
        raise _invalid()
    try:
        raw = b64url.decode(token)  # strict: one spelling per token
    except ValueError:
        raise _invalid() from None
    if len(raw) <= len(_VERSION) + _MAC_SIZE or not raw.startswith(_VERSION):
        raise _invalid()
    return raw[:-_MAC_SIZE], raw[-_MAC_SIZE:]


def _invalid() -> errors.InvalidInput:
    return errors.InvalidInput(
        ErrorCode.ACK_TOKEN_INVALID, "not an ack token issued by this gateway (malformed or forged)"
    )
