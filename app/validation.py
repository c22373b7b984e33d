"""Validators for everything a client sends that may end up in a NATS subject or header.

Every check is a full-string match (``re.fullmatch``), so a trailing newline never passes,
and every function raises :class:`app.errors.InvalidInput` with a stable code.
"""

from __future__ import annotations

import re
from typing import Any

from app.errors import ErrorCode, Forbidden, InvalidInput

_NAME_TOKEN = re.compile(r"[a-zA-Z0-9_-]+")

# A key or subject ends up in a protocol line to NATS, next to a stream name or bucket twice
# (Direct Get appends "$KV.<bucket>.<key>" to "$JS.API.DIRECT.GET.KV_<bucket>.") and a reply
# inbox. nats-server closes the whole connection when that line passes its max_control_line
# (4096 bytes by default), so a 4,000-character key would drop a pooled connection and every
# request on it. 2048 leaves room for all of that and for a JetStream domain.
MAX_SUBJECT_LENGTH = 2048
MAX_HEADER_VALUE_LENGTH = 4096

# Subjects a client may never publish to through the gateway: the JetStream and system APIs,
# acks (those go through signed ack tokens), and the inboxes the gateway's own requests use.
_RESERVED_PREFIXES = ("$JS.", "$JSC.", "$SYS.", "$NRG.", "$MQTT.", "_INBOX.", "_R_.", "$G.")
_DOLLAR_ALLOWED = ("$KV.", "$O.")


# The rules as JSON Schema states them in the OpenAPI document (ECMA-262 regexes, which Python
# reads alike), where one regex can say them: the validators below match these patterns, and
# add the token rules of keys and subjects. ``tests/unit/test_validation`` holds each
# validator to its schema, string by string. A bucket is the stream KV_<bucket>, and stream
# names have at most 255 characters: no longer bucket can exist, and a longer name spliced
# into API subjects could exceed the server's control line (see MAX_SUBJECT_LENGTH).
_S = r"[!-)+,/-=?-~-]"  # a subject token's characters (_SUBJECT_TOKEN)
_K = r"[-/_=a-zA-Z0-9]"  # a key token's characters (_KEY_FILTER_TOKEN)
SCHEMAS: dict[str, dict[str, Any]] = {
    "stream": {"pattern": r"^[a-zA-Z0-9_-]{1,255}$", "minLength": 1, "maxLength": 255},
    "consumer": {"pattern": r"^[a-zA-Z0-9_-]{1,255}$", "minLength": 1, "maxLength": 255},
    "bucket": {"pattern": r"^[a-zA-Z0-9_-]{1,252}$", "minLength": 1, "maxLength": 252},
    "group": {"pattern": r"^[a-zA-Z0-9/_=-]{1,16}$", "minLength": 1, "maxLength": 16},
    "pin_id": {"pattern": r"^[a-zA-Z0-9_-]{1,64}$", "minLength": 1, "maxLength": 64},
    "key": {
        "pattern": rf"^{_K}+(\.{_K}+)*$",
        "minLength": 1,
        "maxLength": MAX_SUBJECT_LENGTH,
    },
    # A key a write takes: its first token does not start with the reserved "_kv".
    "written_key": {
        "pattern": rf"^([-/=a-zA-Z0-9]{_K}*|_([-/_=a-jl-zA-Z0-9]{_K}*)?"
        rf"|_k([-/_=a-uw-zA-Z0-9]{_K}*)?)(\.{_K}+)*$",
        "minLength": 1,
        "maxLength": MAX_SUBJECT_LENGTH,
    },
    "key_filter": {
        "pattern": rf"^(({_K}+|\*)(\.({_K}+|\*))*(\.>)?|>)$",
        "minLength": 1,
        "maxLength": MAX_SUBJECT_LENGTH,
    },
    "subject": {
        "pattern": rf"^{_S}+(\.{_S}+)*$",
        "minLength": 1,
        "maxLength": MAX_SUBJECT_LENGTH,
    },
    "subject_filter": {
        "pattern": rf"^(({_S}+|\*)(\.({_S}+|\*))*(\.>)?|>)$",
        "minLength": 1,
        "maxLength": MAX_SUBJECT_LENGTH,
    },
    # A per-key TTL (ADR-48): "never", or a duration of at least 1 second (seconds or Go
    # syntax; the format "nats-ttl" in docs/api.md).
    "ttl": {"format": "nats-ttl", "minLength": 1},
    "header_name": {"pattern": r"^[!#$%&'*+\-.^_`|~0-9a-zA-Z]+$", "minLength": 1},
    "header_value": {
        "pattern": "^[^\\x00-\\x08\\x0a-\\x1f\\x7f]*$",  # no control characters but tab
        "maxLength": MAX_HEADER_VALUE_LENGTH,
    },
}

# The validators' regexes are the schemas' patterns (full matches, so "^...$" is no loophole).
_BUCKET = re.compile(SCHEMAS["bucket"]["pattern"])
_STREAM = re.compile(SCHEMAS["stream"]["pattern"])  # consumer names too
# ADR-42 priority groups: the limited-term of ADR-6, at most 16 characters (as the server checks).
_GROUP = re.compile(SCHEMAS["group"]["pattern"])
# Pin ids are server-made NUIDs (22 characters); allow some room, never CR/LF or spaces.
_PIN_ID = re.compile(SCHEMAS["pin_id"]["pattern"])
_KEY_FILTER_TOKEN = re.compile(rf"{_K}+|\*|>")
# A literal key, and a literal subject, whole: one match (no split into tokens).
_WHOLE_KEY = re.compile(SCHEMAS["key"]["pattern"])
_WHOLE_SUBJECT = re.compile(SCHEMAS["subject"]["pattern"])
# A subject token: printable ASCII without the separator and the wildcards.
_SUBJECT_TOKEN = re.compile(f"{_S}+")
_HEADER_NAME = re.compile(SCHEMAS["header_name"]["pattern"])
_HEADER_VALUE = re.compile(SCHEMAS["header_value"]["pattern"])


REVISION_DIGITS = 19
"""Revisions and sequences in entity tags and cursors: up to 19 digits (below 10^19; a stream
reaches 2^63 no sooner than in 290,000 years at a million messages a second)."""
REVISION_TAG = rf'"[1-9][0-9]{{0,{REVISION_DIGITS - 1}}}"|[1-9][0-9]{{0,{REVISION_DIGITS - 1}}}'
"""An entity tag naming one revision, as If-Match takes it: quoted, or bare."""


def is_name_token(value: str) -> bool:
    return _NAME_TOKEN.fullmatch(value) is not None


def _matching(pattern: re.Pattern[str], value: str, code: ErrorCode, detail: str) -> str:
    if pattern.fullmatch(value) is None:
        raise InvalidInput(code, detail)
    return value


def stream_name(value: str) -> str:
    return _matching(
        _STREAM,
        value,
        ErrorCode.STREAM_NAME_INVALID,
        f"invalid stream name {value!r}: use 1-255 letters, digits, '-' or '_'",
    )


def consumer_name(value: str) -> str:
    return _matching(
        _STREAM,
        value,
        ErrorCode.CONSUMER_NAME_INVALID,
        f"invalid consumer name {value!r}: use 1-255 letters, digits, '-' or '_'",
    )


def subscription_name(value: str) -> str:
    """A push subscription's name: a consumer name's rules (it is a KV key and a label)."""
    return _matching(
        _STREAM,
        value,
        ErrorCode.SUBSCRIPTION_NAME_INVALID,
        f"invalid subscription name {value!r}: use 1-255 letters, digits, '-' or '_'",
    )


def group_name(value: str) -> str:
    return _matching(
        _GROUP,
        value,
        ErrorCode.CONSUMER_GROUP_NAME_INVALID,
        f"invalid priority group {value!r}: 1-16 letters, digits, '-', '_', '/' or '='",
    )


def pin_id(value: str) -> str:
    return _matching(
        _PIN_ID,
        value,
        ErrorCode.CONSUMER_PIN_ID_INVALID,
        "invalid Nats-Pin-Id: send back exactly the pin id the gateway returned "
        "(1-64 letters, digits, '-' or '_')",
    )


def bucket_name(value: str) -> str:
    return _matching(
        _BUCKET,
        value,
        ErrorCode.KV_BUCKET_INVALID,
        f"invalid bucket name {value!r}: use 1-252 letters, digits, '-' or '_'",
    )


def _tokens_ok(value: str, token: re.Pattern[str]) -> bool:
    if not value or len(value) > MAX_SUBJECT_LENGTH:
        return False
    return all(token.fullmatch(part) for part in value.split("."))


def kv_key(value: str, *, writing: bool = False) -> str:
    """A literal KV key (ADR-8). ``writing`` also refuses the reserved ``_kv`` prefix."""
    if len(value) > MAX_SUBJECT_LENGTH or _WHOLE_KEY.fullmatch(value) is None:
        raise InvalidInput(
            ErrorCode.KV_KEY_INVALID,
            f"invalid key {value!r}: letters, digits and -/_=. only, "
            "no empty token, no leading or trailing '.'",
        )
    if writing and value.startswith("_kv"):
        raise InvalidInput(
            ErrorCode.KV_KEY_RESERVED, f"keys starting with '_kv' are reserved: {value!r}"
        )
    return value


def kv_key_filter(value: str) -> str:
    """A key filter: key tokens, or ``*`` / ``>`` as whole tokens, ``>`` last."""
    if not _tokens_ok(value, _KEY_FILTER_TOKEN) or ">" in value[:-1]:
        raise InvalidInput(
            ErrorCode.KV_KEY_FILTER_INVALID,
            f"invalid key filter {value!r}: key tokens, '*' or '>' as whole tokens, '>' last",
        )
    return value


def subject(value: str) -> str:
    """A literal subject: no wildcards, no whitespace, no empty token."""
    if len(value) > MAX_SUBJECT_LENGTH or _WHOLE_SUBJECT.fullmatch(value) is None:
        raise InvalidInput(
            ErrorCode.SUBJECT_INVALID,
            f"invalid subject {value!r}: printable tokens separated by '.', "
            "no whitespace, no wildcards, no empty token",
        )
    return value


def subject_filter(value: str) -> str:
    """A subject filter: like :func:`subject`, plus ``*`` and a final ``>`` as whole tokens."""
    tokens = value.split(".") if value else []
    ok = bool(tokens) and len(value) <= MAX_SUBJECT_LENGTH
    for index, token in enumerate(tokens):
        if token == "*" or (token == ">" and index == len(tokens) - 1):
            continue
        if _SUBJECT_TOKEN.fullmatch(token) is None:
            ok = False
            break
    if not ok:
        raise InvalidInput(
            ErrorCode.SUBJECT_FILTER_INVALID,
            f"invalid subject filter {value!r}: tokens separated by '.', "
            "'*' or '>' only as whole tokens, '>' last",
        )
    return value


def publish_subject(value: str) -> str:
    """A subject a client may publish to: literal, and outside the reserved API namespaces."""
    subject(value)
    if value.startswith(_RESERVED_PREFIXES) or (
        value.startswith("$") and not value.startswith(_DOLLAR_ALLOWED)
    ):
        raise Forbidden(
            ErrorCode.SUBJECT_RESERVED,
            f"subject {value!r} is in a reserved namespace and cannot be published to",
        )
    return value


def header_name(value: str) -> str:
    if _HEADER_NAME.fullmatch(value) is None:
        raise InvalidInput(ErrorCode.HEADER_INVALID, f"invalid header name {value!r}")
    return value


def header_value(name: str, value: str) -> str:
    if len(value) > MAX_HEADER_VALUE_LENGTH or _HEADER_VALUE.fullmatch(value) is None:
        raise InvalidInput(
            ErrorCode.HEADER_INVALID,
            f"invalid value for header {name!r}: control characters (CR, LF, NUL) "
            f"are not allowed and values are limited to {MAX_HEADER_VALUE_LENGTH} characters",
        )
    return value


def sequence(value: int | str, *, field: str = "seq") -> int:
    """A positive stream sequence (1 .. 2^64-1)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, str) and not value.isdigit():
        number = 0
    if not 1 <= number <= 2**64 - 1:
        raise InvalidInput(
            ErrorCode.REQUEST_INVALID, f"{field} must be a whole number from 1 to 2^64-1"
        )
    return number
