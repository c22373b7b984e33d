"""The HTTP pull options turned into pull requests, with every limit checked before NATS sees it.

Defaults and bounds follow ADR-37: expires at least 1 s (30 s by default for a consume);
idle heartbeats 0.5-30 s and at most half of expires; a consume buffers 100 messages by default
and pulls again when half of them have arrived. A fetch or next waits 5 s by default: an HTTP
request should end well within the read timeouts of common clients and proxies (ask for longer
polls explicitly). The gateway's caps (``JSGW_MAX_FETCH_*``) bound what one answer holds.
"""

from __future__ import annotations

from typing import Any

from app import errors, validation
from app.config import Settings
from app.consumers.schemas import (
    CONSUME_EXPIRES,
    CONSUME_MAX_MESSAGES,
    FETCH_EXPIRES,
    ConsumeQuery,
    FetchRequest,
    PullOptions,
)
from app.durations import NS_PER_SECOND
from app.errors import ErrorCode
from app.nats.consume import ConsumeOptions
from app.nats.pull import BIG_BATCH, PullRequest

DEFAULT_EXPIRES_NS = CONSUME_EXPIRES * NS_PER_SECOND
FETCH_EXPIRES_NS = FETCH_EXPIRES * NS_PER_SECOND
MIN_EXPIRES_NS = NS_PER_SECOND
MIN_HEARTBEAT_NS = NS_PER_SECOND // 2
MAX_HEARTBEAT_NS = 30 * NS_PER_SECOND
# ADR-37: heartbeats by default for long fetches; nats.go uses 5 s.
FETCH_HEARTBEAT_NS = 5 * NS_PER_SECOND


def fetch_request(options: PullOptions, settings: Settings, pin_id: str | None) -> PullRequest:
    """A fetch's (or next's) pull request: ``FetchRequest`` sizes, or one message for next."""
    batch, max_bytes = 1, 0
    if isinstance(options, FetchRequest):
        batch, max_bytes = _fetch_size(options, settings)
    expires = _expires(options.expires, settings, no_wait=options.no_wait, default=FETCH_EXPIRES_NS)
    default_hb = FETCH_HEARTBEAT_NS if expires > DEFAULT_EXPIRES_NS else 0
    return PullRequest(
        batch=batch,
        max_bytes=max_bytes,
        expires_ns=expires,
        heartbeat_ns=_heartbeat(options.idle_heartbeat, expires, default_hb),
        no_wait=options.no_wait,
        **_priority(
            options.group, options.min_pending, options.min_ack_pending, options.priority, pin_id
        ),
    )


def _fetch_size(options: FetchRequest, settings: Settings) -> tuple[int, int]:
    if options.max_messages is not None and options.max_bytes is not None:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_FETCH_INVALID, "give max_messages or max_bytes, not both (ADR-37)"
        )
    if options.max_bytes is not None:
        if options.max_bytes > settings.max_fetch_bytes:
            raise errors.InvalidInput(
                ErrorCode.CONSUMER_FETCH_INVALID,
                f"max_bytes is limited to {settings.max_fetch_bytes} (JSGW_MAX_FETCH_BYTES)",
            )
        return settings.max_fetch_messages, options.max_bytes
    batch = options.max_messages or 1
    if batch > settings.max_fetch_messages:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_FETCH_INVALID,
            f"max_messages is limited to {settings.max_fetch_messages} (JSGW_MAX_FETCH_MESSAGES)",
        )
    return batch, 0


def consume_options(
    query: ConsumeQuery, settings: Settings, pin_id: str | None, config: dict[str, Any]
) -> ConsumeOptions:
    """ADR-37 consume options, checked against the consumer's config up front (a consume
    cannot change its requests later, so a refusal would otherwise repeat forever)."""
    if query.max_messages is not None and query.max_bytes is not None:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_CONSUME_INVALID, "give max_messages or max_bytes, not both (ADR-37)"
        )
    expires = _expires(query.expires, settings, no_wait=False, default=DEFAULT_EXPIRES_NS)
    default_hb = min(max(expires // 2, MIN_HEARTBEAT_NS), MAX_HEARTBEAT_NS)
    heartbeat = _heartbeat(query.idle_heartbeat, expires, default_hb)
    if not heartbeat:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_HEARTBEAT_INVALID, "a consume always uses idle heartbeats (ADR-37)"
        )
    template = PullRequest(
        expires_ns=expires,
        heartbeat_ns=heartbeat,
        **_priority(query.group, query.min_pending, query.min_ack_pending, query.priority, pin_id),
    )
    max_bytes = query.max_bytes or 0
    max_messages = 0 if max_bytes else (query.max_messages or CONSUME_MAX_MESSAGES)
    if max_messages > settings.max_fetch_messages or max_bytes > settings.max_fetch_bytes:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_CONSUME_INVALID,
            f"the buffer is limited to {settings.max_fetch_messages} messages or "
            f"{settings.max_fetch_bytes} bytes (JSGW_MAX_FETCH_MESSAGES / _BYTES)",
        )
    threshold_messages = _threshold(query.threshold_messages, max_messages, "messages")
    threshold_bytes = _threshold(query.threshold_bytes, max_bytes, "bytes")
    bytes_batch = min(BIG_BATCH, config.get("max_batch") or BIG_BATCH)
    request = PullRequest(
        batch=max_messages or bytes_batch,
        max_bytes=max_bytes,
        expires_ns=template.expires_ns,
        group=template.group,
        min_pending=template.min_pending,
        min_ack_pending=template.min_ack_pending,
        pin_id=pin_id,
    )
    check_against(config, request, bytes_mode=bool(max_bytes))
    return ConsumeOptions(
        template=template,
        max_messages=max_messages,
        max_bytes=max_bytes,
        threshold_messages=threshold_messages,
        threshold_bytes=threshold_bytes,
        bytes_batch=bytes_batch,
        pin_id=pin_id,
    )


def _threshold(value: int | None, maximum: int, unit: str) -> int:
    if value is None:
        return maximum // 2
    if maximum and value > maximum:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_CONSUME_INVALID, f"threshold_{unit} cannot be above max_{unit}"
        )
    return value


def check_against(config: dict[str, Any], request: PullRequest, *, bytes_mode: bool) -> None:
    """Refuse a pull the consumer would refuse, with a clear 4xx, before sending it."""
    if config.get("deliver_subject"):
        raise errors.Conflict(
            ErrorCode.CONSUMER_PUSH_BASED, "a push consumer cannot be pulled from"
        )
    max_batch = config.get("max_batch") or 0
    if max_batch and request.batch > max_batch and not bytes_mode:
        raise errors.Conflict(
            ErrorCode.CONSUMER_MAX_BATCH_EXCEEDED,
            f"{request.batch} messages is more than the consumer's max_batch of {max_batch}",
        )
    max_expires = config.get("max_expires") or 0
    if max_expires and request.expires_ns > max_expires:
        raise errors.Conflict(
            ErrorCode.CONSUMER_MAX_EXPIRES_EXCEEDED,
            f"expires is above the consumer's max_expires of {max_expires / NS_PER_SECOND:g}s",
        )
    max_bytes = config.get("max_bytes") or 0
    if max_bytes and request.max_bytes > max_bytes:
        raise errors.Conflict(
            ErrorCode.CONSUMER_MAX_BYTES_EXCEEDED,
            f"max_bytes is above the consumer's max_bytes of {max_bytes}",
        )
    _check_group(config, request)


def _check_group(config: dict[str, Any], request: PullRequest) -> None:
    policy = config.get("priority_policy") or "none"
    groups = config.get("priority_groups") or []
    if request.group is None:
        if policy != "none":
            raise errors.Conflict(
                ErrorCode.CONSUMER_GROUP_REQUIRED,
                f"this consumer has priority groups {groups}: give a group",
            )
        return
    if request.group not in groups:
        raise errors.Conflict(
            ErrorCode.CONSUMER_GROUP_INVALID,
            f"group {request.group!r} is not one of the consumer's priority_groups {groups}",
        )
    if (request.min_pending or request.min_ack_pending) and policy != "overflow":
        raise errors.Conflict(
            ErrorCode.CONSUMER_NOT_OVERFLOW,
            "min_pending and min_ack_pending need the overflow policy",
        )
    if request.pin_id and policy != "pinned_client":
        raise errors.Conflict(
            ErrorCode.CONSUMER_NOT_PINNED_CLIENT, "a Nats-Pin-Id needs the pinned_client policy"
        )


def _expires(value: int | None, settings: Settings, *, no_wait: bool, default: int) -> int:
    if value is None:
        # no_wait without expires: the server answers at once (404 when there is nothing).
        return 0 if no_wait else default
    maximum = round(settings.max_fetch_expires * NS_PER_SECOND)
    if not MIN_EXPIRES_NS <= value <= maximum:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_EXPIRES_INVALID,
            f"expires must be from 1s to {settings.max_fetch_expires:g}s (JSGW_MAX_FETCH_EXPIRES)",
        )
    return value


def _heartbeat(value: int | None, expires: int, default: int) -> int:
    if value is None or value == 0:
        return default if value is None else 0
    if not MIN_HEARTBEAT_NS <= value <= MAX_HEARTBEAT_NS or 2 * value > expires:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_HEARTBEAT_INVALID,
            "idle_heartbeat must be from 0.5s to 30s and at most half of expires",
        )
    return value


def _priority(
    group: str | None,
    min_pending: int | None,
    min_ack_pending: int | None,
    priority: int | None,
    pin_id: str | None,
) -> dict[str, Any]:
    if pin_id is not None:
        validation.pin_id(pin_id)
    if group is None and (min_pending or min_ack_pending or priority is not None or pin_id):
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_GROUP_OPTIONS,
            "min_pending, min_ack_pending, priority and Nats-Pin-Id belong to a priority group: "
            "give the group",
        )
    return {
        "group": group,
        "min_pending": min_pending or 0,
        "min_ack_pending": min_ack_pending or 0,
        "priority": priority or 0,
        "pin_id": pin_id,
    }
