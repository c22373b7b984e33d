"""Atomic batch publishing (ADR-50): all the messages of a request stored in one stream, or
none of them.

The wire protocol, as nats-server implements it (server/stream.go
``processJetStreamAtomicBatchMsg``): every message carries ``Nats-Batch-Id`` (at most 64
characters; here 22 random base-62 characters, a fresh one per request) and
``Nats-Batch-Sequence`` 1..n; the last one also ``Nats-Batch-Commit: 1``. The server stages
the messages, answers each one that has a reply subject with an empty message (staged) or an
error, and on the commit checks every message's headers against the stream as it is then
(expected sequences, de-duplication, schedules...), stores them all under the stream's lock
and answers the commit with a PubAck ``{stream, seq, batch, count}`` whose ``seq`` is the last
message's; or refuses the whole batch with one error. Every message here has a reply subject:
a message refused on its way (the stream's max_msg_size, too many batches in flight) is
answered with the reason, where the commit alone would only say "incomplete".

Never a half-sent batch: the request body is read and every message checked (and the stream
resolved) before anything is sent, and then all the messages are queued on one NATS
connection in one step, with nothing awaited in between
(:meth:`app.nats.replies.ReplyMux.request_batch`): a client that goes away, or a cancelled
handler, cannot cut the batch. What remains is the NATS connection breaking half-way through
writing it: the server then holds an uncommitted batch, stores none of it, and abandons it
after ``max_batch_timeout`` (10 s by default) without a message since, with an advisory
(``$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.<stream>``). Meanwhile it counts against the
stream's 50 batches in flight; so whenever the outcome is unknown the gateway also sends, on
a connection that is up, one more message of the batch with ``Nats-Batch-Commit: abandon``:
an unknown commit value makes the server drop the batch at once if it is still open, and is
answered "incomplete", changing nothing, if it was committed or never began.

The server's rules for atomic batches, checked here before sending (400
``publish.batch_invalid``): no ``Nats-Expected-Last-Msg-Id``; ``Nats-Expected-Last-Sequence``
on the first message only; a ``Nats-Msg-Id`` once in the batch;
``Nats-Expected-Last-Subject-Sequence`` not on a subject an earlier message of the batch
writes to.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from app import errors
from app.errors import ErrorCode

if TYPE_CHECKING:  # (the service imports this module)
    from app.publish.service import Outgoing

MAX_MESSAGES = 1000
"""The server's limit of messages in an atomic batch (``streamDefaultMaxAtomicBatchSize``;
its ``jetstream.limits.batch.max_msgs`` may lower it, which it then answers 413 as well)."""

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
_ID_ALPHABET = string.ascii_letters + string.digits
_ID_LENGTH = 22  # 131 bits, as a NUID (the server takes up to 64 characters)


def new_batch_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


def check_rules(messages: list[Outgoing]) -> None:
    """The server's header rules for atomic batches (400 ``publish.batch_invalid``)."""
    ids: dict[str, int] = {}
    written: set[str] = set()
    for index, message in enumerate(messages):
        headers = message.headers
        if "Nats-Expected-Last-Msg-Id" in headers:
            _refuse(index, "Nats-Expected-Last-Msg-Id is not supported in an atomic batch")
        if index and "Nats-Expected-Last-Sequence" in headers:
            _refuse(
                index,
                "Nats-Expected-Last-Sequence may only be on the first message of an atomic "
                "batch (it is checked against the stream as it was before the batch)",
            )
        msg_id = headers.get("Nats-Msg-Id")
        if msg_id is not None:
            if msg_id in ids:
                _refuse(index, f"its Nats-Msg-Id is that of messages[{ids[msg_id]}]")
            ids[msg_id] = index
        if "Nats-Expected-Last-Subject-Sequence" in headers and message.subject in written:
            _refuse(
                index,
                "Nats-Expected-Last-Subject-Sequence on a subject an earlier message of the "
                "batch writes to (the server cannot check it)",
            )
        written.add(message.subject)


def _refuse(index: int, detail: str) -> None:
    raise errors.InvalidInput(ErrorCode.PUBLISH_BATCH_INVALID, f"messages[{index}]: {detail}")


async def stream_of(
    capturing: Callable[[list[str]], Awaitable[dict[str, str | None]]], messages: list[Outgoing]
) -> str:
    """The one stream that captures every subject of the batch (``capturing``: the
    streams service's lookup of many, cached a few seconds): 404 ``stream.no_match`` naming a
    message no stream captures, 409 ``publish.batch_streams`` when there are several (what
    the streams' subjects are now decides it, not the request's form)."""
    by_subject = await capturing(list(dict.fromkeys(message.subject for message in messages)))
    names: dict[str, int] = {}
    for index, message in enumerate(messages):
        stream = by_subject[message.subject]
        if stream is None:
            raise errors.StreamNoMatch(
                detail=f"messages[{index}]: no stream captures subject {message.subject!r}"
            )
        names.setdefault(stream, index)
    if len(names) > 1:
        (first, i), (second, j) = list(names.items())[:2]
        raise errors.Conflict(
            ErrorCode.PUBLISH_BATCH_STREAMS,
            f"an atomic batch is stored in one stream, but messages[{i}] goes to {first!r} "
            f"and messages[{j}] to {second!r}",
        )
    return next(iter(names))


def framed(
    messages: list[Outgoing], batch_id: str, max_payload: int
) -> list[tuple[str, dict[str, str], bytes]]:
    """The messages as sent: (subject, headers with the batch headers, payload). 413
    ``message.too_large`` naming the first message the batch headers take past
    ``max_payload`` (the server would close the connection on it, failing every request
    waiting there): then nothing is sent."""
    out = []
    last = len(messages)
    for seq, message in enumerate(messages, 1):
        headers = {**message.headers, BATCH_ID: batch_id, BATCH_SEQUENCE: str(seq)}
        if seq == last:
            headers[BATCH_COMMIT] = "1"
        size = replace(message, headers=headers).size
        if size > max_payload:
            raise errors.PayloadTooLarge(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"messages[{seq - 1}]: with the batch headers ({size - message.size} bytes) the "
                f"message is {size} bytes, over the server's max_payload of {max_payload}",
            )
        out.append((message.subject, headers, message.data))
    return out


def abandon(batch_id: str, messages: list[Outgoing]) -> tuple[str, dict[str, str]]:
    """The message that drops the batch if the server still holds it open (see above)."""
    headers = {
        BATCH_ID: batch_id,
        BATCH_SEQUENCE: str(len(messages) + 1),
        BATCH_COMMIT: "abandon",
    }
    return messages[-1].subject, headers
