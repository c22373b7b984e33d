"""Dead letters: a message the application could not take, republished with its origin.

The dead letter carries the message's payload and headers, less those a stream acts on when
it stores a message (``Nats-Expected-*``, ``Nats-Rollup``, ``Nats-TTL``, schedules, batches,
counters: copied, they would make the dead-letter stream refuse or transform it), plus::

    Nats-Dlq-Reason     why: "HTTP 400", "dropped by the application",
                        "max_deliver (5) reached: HTTP 503", ...
    Nats-Dlq-Stream     Nats-Dlq-Sequence     Nats-Dlq-Subject     Nats-Dlq-Delivered
    Nats-Msg-Id         the message's own, else "<stream>:<sequence>": a dead letter
                        published twice (its term lost, the message delivered again) is
                        stored once by a stream with a duplicate window

When a stream stores the subject, the publish waits for its PubAck (a refusal, or none in
time, is an error: the message is then not terminated). When none does, the dead letter is a
plain NATS publish, for whoever subscribes.
"""

from __future__ import annotations

from nats.aio.msg import Msg

from app import errors
from app.publish.service import Outgoing, Publisher, fitting
from app.push.mapping import Delivery

# Headers a stream acts on when it stores a message, by prefix, in lower case.
_ACTED_ON = (
    "nats-expected-",
    "nats-rollup",
    "nats-ttl",
    "nats-batch-",
    "nats-schedule",
    "nats-incr",
    "nats-counter",
    "nats-required-api-level",
    "nats-msg-id",
    "nats-pin-id",
    "nats-dlq-",
)
_MAX_REASON = 1024


def message(subject: str, delivery: Delivery, reason: str) -> Outgoing:
    """The dead letter of ``delivery``, to be published on ``subject``."""
    msg: Msg = delivery.msg
    meta = delivery.meta
    headers = {
        name: value
        for name, value in (msg.headers or {}).items()
        if not name.lower().startswith(_ACTED_ON)
    }
    headers.update(
        {
            "Nats-Msg-Id": delivery.key,
            "Nats-Dlq-Reason": _one_line(reason),
            "Nats-Dlq-Stream": meta.stream,
            "Nats-Dlq-Sequence": str(meta.stream_seq),
            "Nats-Dlq-Subject": msg.subject,
            "Nats-Dlq-Delivered": str(meta.delivered),
        }
    )
    return Outgoing(subject, msg.data, headers)


async def publish(publisher: Publisher, subject: str, delivery: Delivery, reason: str) -> None:
    """Publish the dead letter: stored (PubAck) when a stream takes the subject, else sent."""
    outgoing = fitting(message(subject, delivery, reason), publisher.pool.max_payload)
    try:
        await publisher.publish(outgoing, operation="push_dead_letter")
    except errors.StreamNoMatch:
        client = publisher.pool.pick()
        await publisher.pool.observe(
            "push.dead_letter",
            lambda: client.publish(outgoing.subject, outgoing.data, headers=outgoing.headers),
        )


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)[:_MAX_REASON]
