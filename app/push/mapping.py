"""A delivered message as the HTTP request the application receives.

One message: the payload is the body; the NATS metadata and the message's own headers are
HTTP headers::

    Content-Type     the message's Content-Type header, else application/octet-stream
    Nats-Subject     the subject it was published to
    Nats-Stream      Nats-Consumer
    Nats-Sequence    its stream sequence
    Nats-Delivered   how many times it has been delivered (1: the first time)
    Nats-Time        when it was stored (RFC 3339, UTC)
    Nats-Msg-Id      its own Nats-Msg-Id, else "<stream>:<sequence>": the key to
                     de-duplicate on (a message is delivered at least once)

The message's own headers follow when they are valid HTTP fields (a token for a name, no
control characters in the value); framing and hop-by-hop fields (Host, Content-Length,
Transfer-Encoding, Connection...) and the names above are never taken from the message.

``format: cloudevents`` adds CloudEvents 1.0 in binary mode: ``ce-specversion: 1.0``,
``ce-id`` (the de-duplication key), ``ce-source`` (the message's ``ce-source`` header, else
``/jsgw/streams/<stream>``), ``ce-type`` (the message's ``ce-type``, else
``io.nats.jetstream.message``), ``ce-time`` and ``ce-subject`` (the NATS subject); the
message's other ``ce-*`` headers (extensions) pass as they are. A message that is already a
structured CloudEvent (``Content-Type: application/cloudevents+json``) is passed as it is.

A batch is a JSON array of Message JSON (what a fetch answers, without ``ack_token``), each
with an ``id``, the de-duplication key its status refers to.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from nats.aio.msg import Msg

from app.durations import time_from_ns
from app.nats import headers as nats_headers
from app.nats.acks import AckSubject

CLOUDEVENTS_JSON = "application/cloudevents+json"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
CE_TYPE = "io.nats.jetstream.message"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-zA-Z]+")
_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
_MAX_VALUE = 8192
# Never taken from a message: the request's framing, hop-by-hop fields, and what the gateway
# sets itself.
_FRAMING = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
_OWN = frozenset(
    {
        "content-type",
        "nats-subject",
        "nats-stream",
        "nats-consumer",
        "nats-sequence",
        "nats-delivered",
        "nats-time",
        "nats-msg-id",
        "nats-pin-id",
    }
)
_CE_OWN = frozenset({"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-subject"})


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message the runner holds, with the metadata of its ack subject."""

    msg: Msg
    meta: AckSubject

    @property
    def key(self) -> str:
        """What the application de-duplicates on: the message's Nats-Msg-Id, else
        ``<stream>:<sequence>``."""
        own = header(self.msg, "Nats-Msg-Id")
        return own if own else f"{self.meta.stream}:{self.meta.stream_seq}"

    @property
    def time(self) -> str:
        return time_from_ns(self.meta.timestamp_ns)


@dataclass(frozen=True, slots=True)
class Request:
    body: bytes
    headers: list[tuple[str, str]]


def header(msg: Msg, name: str) -> str | None:
    """A header of the message, by its name in any case."""
    found = msg.headers
    if not found:
        return None
    value = found.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, item in found.items():
        if key.lower() == lowered:
            return item
    return None


def passable(name: str, value: str) -> bool:
    """Whether a message header may go out as an HTTP header field as it is."""
    return (
        _TOKEN.fullmatch(name) is not None
        and len(value) <= _MAX_VALUE
        and _VALUE.fullmatch(value) is not None
        and name.lower() not in _FRAMING
    )


def single(delivery: Delivery, consumer: str, cloudevents: bool) -> Request:
    """The request that delivers one message."""
    msg, meta = delivery.msg, delivery.meta
    content_type = header(msg, "Content-Type")
    key = delivery.key
    out = [
        ("Content-Type", content_type or DEFAULT_CONTENT_TYPE),
        ("Nats-Subject", msg.subject),
        ("Nats-Stream", meta.stream),
        ("Nats-Consumer", consumer),
        ("Nats-Sequence", str(meta.stream_seq)),
        ("Nats-Delivered", str(meta.delivered)),
        ("Nats-Time", delivery.time),
        ("Nats-Msg-Id", key),
    ]
    structured = (content_type or "").split(";", 1)[0].strip().lower() == CLOUDEVENTS_JSON
    binary = cloudevents and not structured
    if binary:
        out += [
            ("ce-specversion", "1.0"),
            ("ce-id", key),
            ("ce-source", _own_ce(msg, "ce-source") or f"/jsgw/streams/{meta.stream}"),
            ("ce-type", _own_ce(msg, "ce-type") or CE_TYPE),
            ("ce-time", delivery.time),
            ("ce-subject", msg.subject),
        ]
    for name, value in (msg.headers or {}).items():
        lowered = name.lower()
        if lowered in _OWN or (binary and lowered in _CE_OWN) or not passable(name, value):
            continue
        out.append((name, value))
    return Request(msg.data, out)


def _own_ce(msg: Msg, name: str) -> str | None:
    value = header(msg, name)
    return value if value and passable(name, value) else None


def batch(deliveries: Sequence[Delivery], consumer: str) -> Request:
    """The request that delivers several messages: a JSON array, one Message JSON each."""
    items = [message_json(delivery) for delivery in deliveries]
    stream = deliveries[0].meta.stream
    headers = [
        ("Content-Type", "application/json"),
        ("Nats-Stream", stream),
        ("Nats-Consumer", consumer),
    ]
    return Request(orjson.dumps(items), headers)


def message_json(delivery: Delivery) -> dict[str, object]:
    msg, meta = delivery.msg, delivery.meta
    return {
        "id": delivery.key,
        "stream": meta.stream,
        "subject": msg.subject,
        "seq": meta.stream_seq,
        "time": delivery.time,
        "headers": nats_headers.from_nats_py(msg.headers),
        "data": base64.b64encode(msg.data).decode(),
        "delivered": meta.delivered,
        "consumer_seq": meta.consumer_seq,
        "pending": meta.pending,
    }
