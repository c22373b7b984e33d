"""Pull requests to ``$JS.API.CONSUMER.MSG.NEXT`` (ADR-37, ADR-42) and the statuses answering them.

nats-py has no ADR-37 fetch and none of ADR-42 (groups, ``min_pending``, pin ids), so the
gateway publishes the pull requests itself and reads the replies on an inbox of its own. The
server answers a pull with user messages (which carry a ``$JS.ACK`` reply subject) and status
messages (no reply, a ``NATS/1.0 <code> <description>`` header line): 100 idle heartbeat, 404
no messages, 408 expired, 409 for several endings and refusals, 423 for a stale pin id.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import nats.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app import errors
from app.compat import drop_message_iterator
from app.errors import ErrorCode

PIN_HEADER = "Nats-Pin-Id"
PENDING_MESSAGES_HEADER = "Nats-Pending-Messages"
PENDING_BYTES_HEADER = "Nats-Pending-Bytes"
# ADR-37: with max_bytes only, ask for "many" messages so the server does not stop at one.
BIG_BATCH = 1_000_000
# A fetch waits this much past its ``expires`` for the server's 408 before giving up.
CLIENT_MARGIN = 2.0
_HEADER_BLOCK_OVERHEAD = len("NATS/1.0\r\n\r\n")


@dataclass(frozen=True, slots=True)
class PullRequest:
    """One ``CONSUMER.MSG.NEXT`` request body (JSApiConsumerGetNextRequest + PriorityGroup)."""

    batch: int = 1
    max_bytes: int = 0
    expires_ns: int = 0
    heartbeat_ns: int = 0
    no_wait: bool = False
    group: str | None = None
    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int = 0
    pin_id: str | None = None

    def payload(self) -> bytes:
        body = {
            "batch": self.batch,
            "max_bytes": self.max_bytes,
            "expires": self.expires_ns,
            "idle_heartbeat": self.heartbeat_ns,
            "no_wait": self.no_wait,
            "group": self.group,
            "min_pending": self.min_pending,
            "min_ack_pending": self.min_ack_pending,
            "priority": self.priority,
            "id": self.pin_id,
        }
        # The server's fields are all omitempty: leave out what is unset.
        return orjson.dumps({key: value for key, value in body.items() if value})

    @property
    def expires(self) -> float:
        return self.expires_ns / 1e9

    @property
    def heartbeat(self) -> float:
        return self.heartbeat_ns / 1e9


@dataclass(frozen=True, slots=True)
class Status:
    """A status message answering a pull request."""

    code: int
    description: str
    pending_messages: int | None = None
    pending_bytes: int | None = None

    @property
    def heartbeat(self) -> bool:
        return self.code == 100

    @property
    def pin_lost(self) -> bool:
        return self.code == 423

    @property
    def no_responders(self) -> bool:
        return self.code == 503

    @property
    def ends_quietly(self) -> bool:
        """The pull is over, nothing went wrong (ADR-37 "not telegraphed", plus a few more)."""
        if self.code in (404, 408):
            return True
        return self.code == 409 and self.description.startswith(_QUIET_409)

    @property
    def message_too_large(self) -> bool:
        return self.code == 409 and self.description.startswith(_SIZE_EXCEEDED)

    @property
    def terminal(self) -> bool:
        """A consume cannot go on: pulling again would fail alike (or the consumer is gone)."""
        return self.code == 400 or (self.code == 409 and self.description.startswith(_TERMINAL_409))

    def error(self) -> errors.GatewayError:
        """The gateway error for a status that refuses or breaks off a pull.

        Pull statuses carry no err_code: the server tells its 400/409 variants apart only by
        the description, so that is what is matched here (by prefix, as every client does).
        """
        description = self.description
        nats = {"code": self.code, "description": description}
        if self.code == 423:
            return errors.Locked(
                ErrorCode.CONSUMER_PIN_MISMATCH,
                "this pin id is no longer the pinned client of the group: drop it and pull "
                "without a Nats-Pin-Id",
                nats=nats,
            )
        for prefix, (code, detail) in _STATUS_ERRORS.items():
            if description.startswith(prefix):
                error = errors.for_code(code, f"{detail} ({description})", nats=nats)
                if isinstance(error, errors.TooManyRequests):
                    error.headers = {"Retry-After": "1"}
                return error
        if self.code == 400:
            return errors.InvalidInput(ErrorCode.CONSUMER_PULL_INVALID, description, nats=nats)
        return errors.UpstreamError(ErrorCode.CONSUMER_PULL_FAILED, description, nats=nats)


_QUIET_409 = ("Message Size Exceeds MaxBytes", "Batch Completed", "Leadership Change")
_SIZE_EXCEEDED = "Message Size Exceeds MaxBytes"
# ADR-37 lists the "Exceeded ..." statuses as warnings, but the gateway cannot change the
# request its client asked for, so repeating it would only loop: they end a consume too.
_TERMINAL_409 = (
    "Consumer Deleted",
    "Consumer is push based",
    "Exceeded MaxRequestBatch",
    "Exceeded MaxRequestExpires",
    "Exceeded MaxRequestMaxBytes",
)
_MAX_WAITING = "Exceeded MaxWaiting"
# The class of each code is the registry's (ErrorCode.error_class).
_STATUS_ERRORS: dict[str, tuple[ErrorCode, str]] = {
    "Consumer Deleted": (ErrorCode.CONSUMER_DELETED, "the consumer was deleted"),
    "Consumer is push based": (
        ErrorCode.CONSUMER_PUSH_BASED,
        "a push consumer cannot be pulled from",
    ),
    "Exceeded MaxRequestBatch": (
        ErrorCode.CONSUMER_MAX_BATCH_EXCEEDED,
        "more messages than the consumer's max_batch",
    ),
    "Exceeded MaxRequestExpires": (
        ErrorCode.CONSUMER_MAX_EXPIRES_EXCEEDED,
        "expires is above the consumer's max_expires",
    ),
    "Exceeded MaxRequestMaxBytes": (
        ErrorCode.CONSUMER_MAX_BYTES_EXCEEDED,
        "max_bytes is above the consumer's max_bytes",
    ),
    _MAX_WAITING: (
        ErrorCode.CONSUMER_MAX_WAITING_EXCEEDED,
        "too many pull requests are waiting on this consumer (max_waiting); retry shortly",
    ),
    "Bad Request - Priority Group missing": (
        ErrorCode.CONSUMER_GROUP_REQUIRED,
        "this consumer has priority groups: give a group",
    ),
    "Bad Request - Invalid Priority Group": (
        ErrorCode.CONSUMER_GROUP_INVALID,
        "the group is not one of the consumer's priority_groups",
    ),
    "Bad Request - Not a Overflow Priority consumer": (
        ErrorCode.CONSUMER_NOT_OVERFLOW,
        "min_pending and min_ack_pending need the overflow policy",
    ),
    "Bad Request - Not a Pinned Client Priority consumer": (
        ErrorCode.CONSUMER_NOT_PINNED_CLIENT,
        "a pin id needs the pinned_client policy",
    ),
    "Bad Request - Priority must be between": (
        ErrorCode.CONSUMER_PRIORITY_INVALID,
        "priority must be from 0 to 9",
    ),
    "Bad Request - heartbeat value too large": (
        ErrorCode.CONSUMER_HEARTBEAT_INVALID,
        "idle_heartbeat must be at most half of expires",
    ),
}


def status_of(msg: Msg) -> Status | None:
    """The status of a status message, or None for a user message."""
    headers = msg.headers
    if msg.reply or not headers or "Status" not in headers:
        return None
    code = headers["Status"]
    if not code.isdigit():
        return None
    # nats-py keys it with a str enum member equal (and hashing equal) to "Description".
    description = str(headers.get("Description", ""))
    return Status(
        int(code),
        description.strip(),
        _int_header(headers, PENDING_MESSAGES_HEADER),
        _int_header(headers, PENDING_BYTES_HEADER),
    )


def _int_header(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


def message_size(msg: Msg) -> int:
    """A delivered message's size as the server counts it against max_bytes (ADR-37)."""
    header_size = 0
    if msg.headers:
        header_size = _HEADER_BLOCK_OVERHEAD + sum(
            len(str(k)) + len(v) + 4 for k, v in msg.headers.items()
        )
    return len(msg.subject) + len(msg.reply) + header_size + len(msg.data)


@dataclass(slots=True)
class FetchOutcome:
    messages: list[Msg] = field(default_factory=list)
    status: Status | None = None
    """What ended the pull; None when the batch was complete or the client-side wait ran out."""
    stalled: bool = False
    """Neither the end of the pull nor a heartbeat arrived in time."""


async def fetch(
    client: Client, subject: str, request: PullRequest, *, timeout: float
) -> FetchOutcome:
    """One pull request over an inbox subscription of its own, read until the pull is over.

    ``timeout`` is the client-side limit (ADR-37: longer than the request's expiry). With idle
    heartbeats, two missed heartbeats also end the wait.

    The messages are taken by the subscription's callback as nats-py hands them over, and
    only the end of the pull is awaited: ``next_msg`` per message cost a task, a timer and a
    uuid4 each, most of a large fetch's time in the gateway.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    quiet_limit = 2 * request.heartbeat if request.heartbeat_ns else None
    outcome = FetchOutcome()
    over: asyncio.Future[None] = loop.create_future()
    heard = [loop.time()]  # when the last message (or heartbeat) came
    messages = outcome.messages
    batch = request.batch

    async def take(msg: Msg) -> None:
        if over.done():
            return  # after the end of the pull: not the caller's
        if quiet_limit is not None:
            heard[0] = loop.time()
        status = status_of(msg)
        if status is None:
            messages.append(msg)
            if len(messages) >= batch:
                over.set_result(None)
        elif not status.heartbeat:
            outcome.status = status
            over.set_result(None)

    inbox = client.new_inbox()
    sub = await client.subscribe(inbox, cb=take)
    try:
        await client.publish(subject, request.payload(), reply=inbox)
        while not over.done():
            now = loop.time()
            wait = deadline - now
            if quiet_limit is not None:
                wait = min(wait, heard[0] + quiet_limit - now)
            if wait <= 0:
                outcome.stalled = True
                break
            await asyncio.wait((over,), timeout=wait)
        return outcome
    finally:
        if not over.done():
            over.set_result(None)  # what comes while unsubscribing is dropped, as before
        await unsubscribe(sub)


async def unsubscribe(sub: Subscription) -> None:
    """Drop a subscription; a connection that is already gone took it along.

    A subscription without a callback holds nats-py's message iterator (``_message_iterator``,
    a private name: app/compat.py), which holds the subscription: a
    reference cycle of ten objects per Direct Get page, freed only by the garbage
    collector unless the link is cut here. (The gateway reads such subscriptions with
    ``next_msg``, never through ``messages``.)
    """
    try:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    finally:
        drop_message_iterator(sub)
