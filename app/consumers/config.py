"""Consumer configs in and out: the ADR-42 rules, NATS nanoseconds, and consumer info."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from app import errors
from app.consumers.schemas import ConsumerConfig
from app.durations import (
    MAX_TIME,
    nats_time,
    ns_to_seconds,
    parse_duration_ns,
    parse_time,
)
from app.errors import ErrorCode
from app.streams.service import durations_out

_CONFIG_DURATIONS = (
    ("ack_wait",),
    ("max_expires",),
    ("inactive_threshold",),
    ("idle_heartbeat",),
    ("priority_timeout",),
)


def to_nats(name: str, config: ConsumerConfig) -> dict[str, Any]:
    """The ConsumerConfig to send for the durable pull consumer ``name``."""
    for field in ("name", "durable_name"):
        value = getattr(config, field)
        if value is not None and value != name:
            raise errors.InvalidInput(
                ErrorCode.CONSUMER_NAME_MISMATCH,
                f"body {field} {value!r} differs from path {name!r}",
            )
    check_priority(config)
    body = config.model_dump(exclude_none=True)
    body["durable_name"] = name
    body["name"] = name
    return body


def check_priority(config: ConsumerConfig) -> None:
    """ADR-42: groups go with a policy (and a policy with groups), explicit acks, no duplicates.

    nats-server 2.15 accepts a priority policy with ack_policy none/all; ADR-42 requires
    explicit acks, and so does the gateway. Pull-only is enforced by the schema.
    """
    policy = config.priority_policy or "none"
    groups = config.priority_groups or []
    if policy == "none":
        if groups:
            raise errors.InvalidInput(
                ErrorCode.CONSUMER_PRIORITY_POLICY_REQUIRED,
                "priority_groups need a priority_policy: overflow, pinned_client or prioritized",
            )
        if config.priority_timeout:
            raise errors.InvalidInput(
                ErrorCode.CONSUMER_PRIORITY_POLICY_REQUIRED,
                "priority_timeout needs a priority_policy",
            )
        return
    if not groups:
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_PRIORITY_GROUPS_REQUIRED,
            f"priority_policy {policy!r} needs at least one of priority_groups",
        )
    if len(set(groups)) != len(groups):
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_GROUP_NAME_INVALID, "priority_groups has duplicates"
        )
    if config.ack_policy != "explicit":
        raise errors.InvalidInput(
            ErrorCode.CONSUMER_EXPLICIT_ACK_REQUIRED,
            "a consumer with priority groups needs ack_policy 'explicit' (ADR-42)",
        )


def consumer_info_out(info: dict[str, Any]) -> dict[str, Any]:
    """Consumer info with durations in seconds and RFC 3339 times (zero times left out)."""
    config = durations_out(info.get("config") or {}, _CONFIG_DURATIONS)
    if isinstance(config.get("backoff"), list):
        config["backoff"] = [ns_to_seconds(value) for value in config["backoff"]]
    for key in ("opt_start_time", "pause_until"):
        if key in config:
            config[key] = nats_time(config[key])
    out: dict[str, Any] = {
        "stream_name": info.get("stream_name", ""),
        "name": info.get("name", ""),
        "created": nats_time(info.get("created")),
        "config": config,
        "delivered": _sequence_info(info.get("delivered")),
        "ack_floor": _sequence_info(info.get("ack_floor")),
        "num_ack_pending": info.get("num_ack_pending", 0),
        "num_redelivered": info.get("num_redelivered", 0),
        "num_waiting": info.get("num_waiting", 0),
        "num_pending": info.get("num_pending", 0),
        "ts": nats_time(info.get("ts")),
    }
    if info.get("paused"):
        out["paused"] = True
        out["pause_remaining"] = ns_to_seconds(info.get("pause_remaining") or 0)
    groups = [_group_state(state) for state in info.get("priority_groups") or []]
    if groups:
        out["priority_groups"] = groups
    if info.get("cluster"):
        out["cluster"] = info["cluster"]
    return out


def _sequence_info(value: Any) -> dict[str, Any]:
    value = value if isinstance(value, dict) else {}
    out = {"consumer_seq": value.get("consumer_seq", 0), "stream_seq": value.get("stream_seq", 0)}
    last = nats_time(value.get("last_active"))
    if last:
        out["last_active"] = last
    return out


def _group_state(state: dict[str, Any]) -> dict[str, Any]:
    """nats-server reports ``{group, pinned_client_id, pinned_ts}`` (ADR-42 says otherwise)."""
    out: dict[str, Any] = {"group": state.get("group", "")}
    if state.get("pinned_client_id"):
        out["pinned_client_id"] = state["pinned_client_id"]
    pinned_ts = nats_time(state.get("pinned_ts"))
    if pinned_ts:
        out["pinned_ts"] = pinned_ts
    return out


def pause_until(until: str | int | float, now: datetime) -> datetime:
    """When a pause given as an RFC 3339 time or a duration from ``now`` ends; 400
    ``consumer.pause_invalid`` unless that is after ``now``."""
    end: datetime | None = None
    if isinstance(until, str):
        try:
            end = parse_time(until)
        except ValueError:
            end = None
    if end is None:
        try:
            ns = parse_duration_ns(until)
        except ValueError:
            raise _pause_invalid(
                f"until {str(until)[:40]!r} is neither an RFC 3339 time with its offset "
                "(2030-01-01T00:00:00Z) nor a duration (seconds, or e.g. '30s', '1h30m')"
            ) from None
        try:
            end = now + timedelta(microseconds=ns // 1000)
        except OverflowError:
            raise _pause_invalid(f"the pause would end after {MAX_TIME}") from None
    if end <= now:
        raise _pause_invalid("until is not in the future: resume with .../resume instead")
    return end


def _pause_invalid(detail: str) -> errors.GatewayError:
    return errors.InvalidInput(ErrorCode.CONSUMER_PAUSE_INVALID, detail)


def pause_state_out(response: dict[str, Any]) -> dict[str, Any]:
    """A CONSUMER.PAUSE response: ``paused``, and while paused its end and what is left (s)."""
    if not response.get("paused"):
        return {"paused": False}
    return {
        "paused": True,
        "pause_until": nats_time(response.get("pause_until")),
        "pause_remaining": ns_to_seconds(response.get("pause_remaining") or 0),
    }
