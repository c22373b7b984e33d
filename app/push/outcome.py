"""What the application's answer to a delivery means for each message it carried.

The rules, Dapr's pub/sub contract on JetStream's acks (docs/push.md has the table):

- 2xx with an empty body, a body that is not JSON, or JSON without a ``status``: done (ack);
  with ``{"status": "SUCCESS" | "RETRY" | "DROP"}`` (any case): ack, retry, or drop;
  another status value: retry, and the subscription's last error says so (a retry asked
  for with a 2xx waits the answer's ``Retry-After`` too, when it has one);
- 408, 429, 5xx, 3xx (redirects are never followed), no answer in time, no connection:
  retry later;
- any other 4xx: the application refuses the message for good (``HTTP <status>``).

A batch (a JSON array of messages) is answered as a whole by a status that is not 2xx, or
with 2xx by Dapr's bulk body ``{"statuses": [{"entryId", "status"}]}``: an entry missing from
it is retried.

When to retry: the ``Retry-After`` the application sent (seconds or an HTTP date, at most
:data:`MAX_RETRY_AFTER`), else the consumer's ``backoff`` entry for the delivery count, else
:data:`DEFAULT_SCHEDULE`. The delay goes with the nak: nats-server redelivers a nak without
one at once, whatever the consumer's ``backoff`` says (``processNak`` applies ``backoff``
only when ``ack_wait`` runs out), so the gateway picks the delay itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

MAX_RETRY_AFTER = 3600.0
DEFAULT_SCHEDULE = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before the 1st, 2nd, ... redelivery when neither the application nor the
consumer's ``backoff`` says; the last one repeats."""
_RETRIED_STATUSES = frozenset({408, 429})


class Kind(enum.Enum):
    ACK = "ack"
    RETRY = "retry"
    DROP = "drop"
    REJECT = "reject"  # a 4xx: term (or dead-letter) with "HTTP <status>"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: Kind
    reason: str = ""
    """Why (the term reason, the dead letter's Nats-Dlq-Reason, the last error's detail)."""
    retry_after: float | None = None
    """Seconds the application asked to wait (Retry-After), capped."""
    label: str = "success"
    """The answer's class in the latency metric: success, retry, drop, rejected, redirect,
    server_error, timeout, unreachable."""
    noteworthy: bool = False
    """Recorded as the subscription's last error."""


ACK = Verdict(Kind.ACK)


def failure(reason: str, label: str) -> Verdict:
    """No usable answer (``timeout``, ``unreachable``): retried."""
    return Verdict(Kind.RETRY, reason, label=label, noteworthy=True)


def classify(
    status: int, headers: Mapping[str, str], body: bytes | None, now: datetime | None = None
) -> Verdict:
    """The verdict on one message from its answer (``body`` None: not read, too large)."""
    if 200 <= status < 300:
        return _asked(_by_body(_status_field(body), status), headers, now)
    return _by_status(status, headers, now)


def classify_batch(
    status: int,
    headers: Mapping[str, str],
    body: bytes | None,
    ids: Sequence[str],
    now: datetime | None = None,
) -> list[Verdict]:
    """One verdict per message of a batch, in the order of ``ids``."""
    if not 200 <= status < 300:
        return [_by_status(status, headers, now)] * len(ids)
    document = _json(body)
    if not isinstance(document, dict) or not isinstance(document.get("statuses"), list):
        return [_asked(_by_body(_status_field(body), status), headers, now)] * len(ids)
    given: dict[str, Any] = {}
    for item in document["statuses"]:
        if isinstance(item, dict) and isinstance(item.get("entryId"), str):
            given.setdefault(item["entryId"], item.get("status"))
    missing = Verdict(
        Kind.RETRY, "the answer has no status for this entry", label="retry", noteworthy=True
    )
    verdicts = [
        _by_body(given[entry], status) if given.get(entry) is not None else missing for entry in ids
    ]
    return [_asked(verdict, headers, now) for verdict in verdicts]


def _asked(verdict: Verdict, headers: Mapping[str, str], now: datetime | None) -> Verdict:
    """A retry the application asks for with a 2xx waits its Retry-After, if it sent one."""
    if verdict.kind is not Kind.RETRY:
        return verdict
    after = retry_after(headers.get("retry-after"), now)
    return verdict if after is None else replace(verdict, retry_after=after)


def _json(body: bytes | None) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _status_field(body: bytes | None) -> Any:
    document = _json(body)
    return document.get("status") if isinstance(document, dict) else None


def _by_body(value: Any, status: int) -> Verdict:
    """A 2xx answer with Dapr's ``status`` (None: none given)."""
    if value is None:
        return ACK
    text = value.upper() if isinstance(value, str) else None
    if text == "SUCCESS":
        return ACK
    if text == "RETRY":
        return Verdict(Kind.RETRY, "the application asked to retry", label="retry")
    if text == "DROP":
        return Verdict(Kind.DROP, "dropped by the application", label="drop")
    shown = orjson.dumps(value).decode()[:64]
    return Verdict(
        Kind.RETRY,
        f"HTTP {status} with an unknown status {shown} (expected SUCCESS, RETRY or DROP)",
        label="retry",
        noteworthy=True,
    )


def _by_status(status: int, headers: Mapping[str, str], now: datetime | None) -> Verdict:
    reason = f"HTTP {status}"
    if 300 <= status < 400:
        return Verdict(
            Kind.RETRY,
            f"{reason}: a redirect, which the gateway does not follow",
            label="redirect",
            noteworthy=True,
        )
    if status in _RETRIED_STATUSES or status >= 500:
        after = retry_after(headers.get("retry-after"), now)
        label = "server_error" if status >= 500 else "retry"
        return Verdict(Kind.RETRY, reason, retry_after=after, label=label, noteworthy=True)
    if 400 <= status < 500:
        return Verdict(Kind.REJECT, reason, label="rejected", noteworthy=True)
    # 1xx as a final answer (httpx hands over none) or a status past 599.
    return Verdict(Kind.RETRY, f"{reason}: not a final answer", label="retry", noteworthy=True)


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value: a number of seconds, or an HTTP date (RFC 9110
    §10.2.3); at most :data:`MAX_RETRY_AFTER`, never negative; None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return min(float(int(text[:12])), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def retry_delay(delivered: int, backoff: Sequence[float], asked: float | None) -> float:
    """Seconds before the next delivery of a message delivered ``delivered`` times."""
    if asked is not None:
        return asked
    schedule = backoff or DEFAULT_SCHEDULE
    return schedule[min(max(delivered, 1), len(schedule)) - 1]
