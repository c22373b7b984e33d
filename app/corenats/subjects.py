"""Which subjects core publish, request and subscribe may use.

Core NATS reaches every subject of the gateway's account, including the ones the server and
the gateway use for themselves: the JetStream API and its KV and object buckets (``$JS``,
``$JSC``, ``$KV``, ``$O``), the system account (``$SYS``), Raft groups (``$NRG``), MQTT
(``$MQTT``), gateways and leafnodes (``$GR``, ``_GR_``, ``$LDS``), service discovery (``$SRV``),
the server's reply prefix (``_R_``) and the inboxes that carry replies, the gateway's own
included (``_INBOX``). A client that could publish there could call the JetStream API behind
the gateway's access rules, and one that could subscribe there would read other requests'
replies. So a subject whose first token starts with ``$``, or is ``_INBOX``, ``_R_`` or
``_GR_``, is refused (400 ``nats.subject_reserved``), and so is a subscription whose first
token is a wildcard, which reaches all of them.
"""

from __future__ import annotations

import re
from typing import Any

from app import validation
from app.errors import ErrorCode, InvalidInput

RESERVED_TOKENS = frozenset({"_INBOX", "_R_", "_GR_"})
"""First tokens refused besides those that start with ``$``."""

# The rules as the OpenAPI document states them: the subject (filter) schemas of
# app.validation, with lookaheads for the reserved first tokens (ECMA-262 reads them alike).
_NOT_RESERVED = r"(?!\$|(_INBOX|_R_|_GR_)(\.|$))"
SUBJECT_SCHEMA: dict[str, Any] = {
    **validation.SCHEMAS["subject"],
    "pattern": "^" + _NOT_RESERVED + validation.SCHEMAS["subject"]["pattern"][1:],
}
FILTER_SCHEMA: dict[str, Any] = {
    **validation.SCHEMAS["subject_filter"],
    "pattern": r"^(?![*>](\.|$))"
    + _NOT_RESERVED
    + validation.SCHEMAS["subject_filter"]["pattern"][1:],
}

_QUEUE_PATTERN = r"^[a-zA-Z0-9_.=/-]{1,128}$"
QUEUE_SCHEMA: dict[str, Any] = {"pattern": _QUEUE_PATTERN, "minLength": 1, "maxLength": 128}
_QUEUE = re.compile(_QUEUE_PATTERN)


def _reserved(first: str) -> bool:
    return first.startswith("$") or first in RESERVED_TOKENS


def _refuse(value: str, what: str) -> InvalidInput:
    return InvalidInput(
        ErrorCode.NATS_SUBJECT_RESERVED,
        f"{what} {value!r} is in a reserved namespace ('$...', '_INBOX', '_R_', '_GR_'): "
        "core NATS over HTTP does not reach it",
    )


def literal(value: str) -> str:
    """A subject to publish or send a request to: literal, outside the reserved namespaces."""
    validation.subject(value)
    if _reserved(value.split(".", 1)[0]):
        raise _refuse(value, "subject")
    return value


def subscription(value: str) -> str:
    """A subject to subscribe to: wildcards allowed past the first token, which is literal and
    outside the reserved namespaces."""
    validation.subject_filter(value)
    first = value.split(".", 1)[0]
    if first in ("*", ">") or _reserved(first):
        raise _refuse(value, "subject filter")
    return value


def queue(value: str) -> str:
    """A queue group name (NATS takes any token; this is the part that is safe in a URL, a
    log line and a protocol line)."""
    if _QUEUE.fullmatch(value) is None:
        raise InvalidInput(
            ErrorCode.NATS_QUEUE_INVALID,
            f"invalid queue group {value!r}: 1-128 letters, digits, '-', '_', '.', '=' or '/'",
        )
    return value
