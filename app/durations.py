"""Durations and times as the HTTP API speaks them, and as NATS stores them.

Requests give durations as seconds (``1.5``) or Go-style strings (``"1h30m"``); NATS wants
nanoseconds. Responses give seconds. Times are RFC 3339 UTC strings.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

NS_PER_SECOND = 1_000_000_000
_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": NS_PER_SECOND,
    "m": 60 * NS_PER_SECOND,
    "h": 3600 * NS_PER_SECOND,
}
_GO_DURATION = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h)")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
MAX_DURATION_NS = 2**63 - 1
_ZERO_TIME_PREFIX = "0001-01-01"
MIN_TIME = "0001-01-01T00:00:00Z"
MAX_TIME = "9999-12-31T23:59:59.999999Z"
"""The range of times a request may give, once in UTC (Python's, within RFC 3339's)."""


def parse_duration_ns(value: object) -> int:
    """Seconds (number or numeric string) or a Go duration string -> nanoseconds (>= 0)."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '30s'")
    if isinstance(value, int | float):
        # (In seconds, the whole ones the schema states: a float cannot hold the last ns.)
        if value != value or value < 0 or value > MAX_DURATION_NS // NS_PER_SECOND:
            raise ValueError(
                "a duration in seconds is between 0 and 9223372036 (~292 years; up to "
                "'2562047h47m16.854775807s' as a string)"
            )
        # A positive number stays positive (1e-300 s is 1 ns, not "none"), as the rules on
        # such a field ("priority_timeout>0 needs a priority_policy") read the number.
        return max(round(value * NS_PER_SECOND), 1) if value > 0 else 0
    if not isinstance(value, str):
        raise ValueError("a duration is a number of seconds or a string like '30s'")
    text = value.strip()
    try:
        return parse_duration_ns(float(text)) if re.fullmatch(r"\d+(\.\d+)?", text) else _go(text)
    except OverflowError:
        raise ValueError("duration too large") from None


def go_duration_ns(text: str) -> int:
    """A Go duration string (``time.ParseDuration``'s syntax, unsigned) -> nanoseconds."""
    try:
        return _go(text)
    except OverflowError:
        raise ValueError("duration too large") from None


def _go(text: str) -> int:
    if text == "0":
        return 0
    if not re.fullmatch(f"(?:{_GO_DURATION.pattern})+", text):
        raise ValueError(f"not a duration: {text!r} (use seconds, or e.g. '500ms', '30s', '1h30m')")
    # Exact decimal arithmetic: in floats, Go's largest duration would round past int64.
    total = sum(Decimal(number) * _UNITS_NS[unit] for number, unit in _GO_PART.findall(text))
    if total > MAX_DURATION_NS:
        raise ValueError("duration too large")
    return int(total)  # as Go: what is below a nanosecond is dropped


def nats_ttl(value: str) -> str:
    """A per-message TTL as the ``Nats-TTL`` header wants it: ``never``, or >= 1 s as a Go
    duration. Raises ValueError with the reason."""
    text = value.strip()
    if text.lower() == "never":
        return "never"
    ns = parse_duration_ns(text)
    if ns < NS_PER_SECOND:
        raise ValueError("a TTL must be at least 1 second (or 'never')")
    seconds, rest = divmod(ns, NS_PER_SECOND)
    return f"{seconds}s" if rest == 0 else f"{ns // 1_000_000}ms"


def ns_to_seconds(value: int | None) -> float | int | None:
    if value is None:
        return None
    seconds = value / NS_PER_SECOND
    return int(seconds) if seconds.is_integer() else seconds


def parse_time(value: str) -> datetime:
    """An RFC 3339 time; naive times are refused rather than guessed."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"time {value!r} has no UTC offset (add 'Z')")
    try:
        # 9999-12-31T23:59:59-00:01 is valid RFC 3339, but a year 10000 in UTC.
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"time {value!r} is outside {MIN_TIME} to {MAX_TIME}") from None


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def nats_time(value: str | None) -> str | None:
    """Normalise a time as NATS sends it (nanosecond RFC 3339) to RFC 3339 UTC, or None."""
    if not value or value.startswith(_ZERO_TIME_PREFIX):
        return None
    return value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# The last time a Go int64 of nanoseconds since the epoch holds. nats-server finds the first
# message stored at or after a start time by such a number (UnixNano): past it, or before
# 1678, the time wraps around (a Direct Get from a start time in 2999 answered a stream's
# first message). Every message is stored between the epoch and this.
_LATEST_FOR_NATS = datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=UTC)


def time_for_nats(value: datetime) -> str:
    """A time as the JetStream API wants it in a request (four-digit years: strftime's %Y
    gives "1" for the year 1 on glibc, which the server cannot parse)."""
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def start_time_for_nats(value: datetime) -> str:
    """A time the server is to find the first message at or after (a Direct Get's
    ``start_time``), as :func:`time_for_nats` writes it: one outside what the server's clock
    holds is sent as the nearest end of it, which finds the same message (or none)."""
    return time_for_nats(min(max(value, _EPOCH), _LATEST_FOR_NATS))


def ns_from_time(value: datetime) -> int:
    """A time as nanoseconds since the Unix epoch (exact, before 1970 too)."""
    return (value - _EPOCH) // _MICROSECOND * 1000


def time_from_ns(timestamp_ns: int) -> str:
    """A nanosecond Unix time as NATS writes it (RFC 3339, UTC, trailing zeros trimmed)."""
    seconds, fraction = divmod(timestamp_ns, NS_PER_SECOND)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"
