"""Request and response models of counters, and the increment's body as it is parsed."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from app import errors
from app.errors import ErrorCode
from app.schemas import Strict, SubjectFilter, UInt64

MAX_INCREMENT_DIGITS = 100
"""The server adds increments of any size (Go's big.Int) while the stored value fits its
max_payload; 100 digits is past any counter's need (a 128-bit integer has 39) and keeps what
one request can make the value grow by small."""
MAX_INCREMENT_BODY = 16 * 1024
_DECIMAL = re.compile(rf"([+-]?)([0-9]{{1,{MAX_INCREMENT_DIGITS}}})")

INCREMENT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["increment"],
    "additionalProperties": False,
    "properties": {
        "increment": {
            "description": "the amount to add (negative subtracts): a decimal string or a "
            f"JSON integer, at most {MAX_INCREMENT_DIGITS} digits, kept exact",
            "oneOf": [
                {
                    "type": "string",
                    "pattern": f"^[+-]?[0-9]{{1,{MAX_INCREMENT_DIGITS}}}$",
                    "examples": ["5", "-2", "123456789012345678901234567890"],
                },
                # (The bound is in words: a 100-digit bound does not fit a JSON document
                # of 64-bit numbers, which is what many tools, the spec's writer included,
                # read and write.)
                {
                    "type": "integer",
                    "description": f"at most {MAX_INCREMENT_DIGITS} digits",
                },
            ],
        }
    },
}


class _JsonInteger(str):
    """A JSON integer, kept as its text (never through ``int``, let alone ``float``)."""


class _JsonFraction(str):
    """A JSON number with a fraction or an exponent (or NaN, Infinity): not exact."""


def _invalid(detail: str) -> errors.GatewayError:
    return errors.InvalidInput(ErrorCode.COUNTER_INCREMENT_INVALID, detail)


def parse_increment(body: bytes) -> str:
    """The increment of a request body, as the ``Nats-Incr`` header wants it: a decimal
    integer with its sign, without leading zeros."""
    try:
        document = json.loads(
            body, parse_int=_JsonInteger, parse_float=_JsonFraction, parse_constant=_JsonFraction
        )
    except (ValueError, RecursionError):
        raise errors.InvalidInput(
            ErrorCode.REQUEST_INVALID, 'the body is not JSON: send {"increment": "5"}'
        ) from None
    if not isinstance(document, dict):
        raise errors.InvalidInput(
            ErrorCode.REQUEST_INVALID, 'the body is a JSON object: {"increment": "5"}'
        )
    unknown = sorted(set(document) - {"increment"})
    if unknown:
        raise errors.InvalidInput(
            ErrorCode.REQUEST_INVALID, f"unknown members {unknown[:5]}: only increment is taken"
        )
    if "increment" not in document:
        raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, "increment is required")
    return increment_text(document["increment"])


def increment_text(value: Any) -> str:
    """``value`` (a decimal string or a JSON integer) as ``Nats-Incr`` takes it."""
    if isinstance(value, _JsonFraction):
        raise _invalid(f"increment {value[:40]!r} is not a whole number")
    if not isinstance(value, str):  # booleans, null, objects, lists
        raise _invalid("increment is a decimal string or a JSON integer")
    match = _DECIMAL.fullmatch(value)
    if match is None:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise _invalid(
            f"increment {shown!r} is not a whole number of at most {MAX_INCREMENT_DIGITS} "
            "digits with an optional sign"
        )
    sign, digits = match.groups()
    digits = digits.lstrip("0") or "0"
    return digits if sign != "-" or digits == "0" else "-" + digits


class CounterReadRequest(Strict):
    """The values of the counters matching the filters, all as of one stream sequence."""

    subjects: list[SubjectFilter] = Field(min_length=1, fail_fast=True)
    up_to_seq: UInt64 | None = Field(default=None, ge=1)


class Incremented(BaseModel):
    stream: str
    subject: str
    seq: int = Field(description="the sequence of the message that holds the new value")
    value: str = Field(description="the counter's value after the increment (decimal)")


class CounterValue(BaseModel):
    stream: str
    subject: str
    seq: int
    value: str = Field(description="decimal, arbitrary precision")
    sources: dict[str, dict[str, str]] | None = Field(
        default=None,
        description="for a stream that sources counters: the last value seen of each "
        "source stream's subject (`Nats-Counter-Sources`)",
    )


class CounterEntry(BaseModel):
    subject: str
    seq: int
    value: str


class CounterReadResult(BaseModel):
    up_to_seq: int = Field(description="every value is the last at or before this sequence")
    counters: list[CounterEntry]
