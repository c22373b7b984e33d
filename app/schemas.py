"""What every domain's request and response models share: strictness, validated strings,
numbers, messages and problem documents (each domain keeps its own models in its package)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app import validation
from app.durations import (
    MAX_DURATION_NS,
    NS_PER_SECOND,
    parse_duration_ns,
    parse_time,
    time_for_nats,
)
from app.errors import ErrorCode, InvalidInput

_DURATION_SCHEMA = {
    "oneOf": [
        {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_DURATION_NS // NS_PER_SECOND,
            "description": "seconds",
        },
        # go-duration: Go's time.ParseDuration syntax, unsigned, up to 2562047h47m16.854775807s
        # (NATS's int64 nanoseconds); tests/contract generates its extremes.
        {"type": "string", "format": "go-duration", "examples": ["30s", "1h30m", "500ms"]},
    ],
    "description": "seconds, or a Go-style duration string (at most ~292 years)",
}

Duration = Annotated[int, BeforeValidator(parse_duration_ns), WithJsonSchema(_DURATION_SCHEMA)]
"""A duration in a request: seconds or ``"1h30m"``; held as nanoseconds for NATS."""

_TIME_SCHEMA = {"type": "string", "format": "date-time"}


def _time_for_nats(value: str) -> str:
    return time_for_nats(parse_time(value))


Time = Annotated[str, AfterValidator(_time_for_nats), WithJsonSchema(_TIME_SCHEMA)]
"""An RFC 3339 time in a request (0001-01-01 to 9999-12-31 once in UTC), passed on in the form
the JetStream API wants."""

TimeText = Annotated[str, WithJsonSchema({**_TIME_SCHEMA, "description": "RFC 3339"})]
"""An RFC 3339 time that the service checks where it uses it (a 400 naming the parameter)."""


def validated(fn: Any) -> AfterValidator:
    def run(value: Any) -> Any:
        try:
            return fn(value)
        except InvalidInput as exc:
            raise ValueError(exc.detail) from None

    return AfterValidator(run)


SubjectFilter = Annotated[str, validated(validation.subject_filter)]
Subject = Annotated[str, validated(validation.subject)]
StreamName = Annotated[str, validated(validation.stream_name)]
Int64 = Annotated[int, Field(ge=-1, le=2**63 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
# Go's int: the upper bound of every count and limit in a NATS config. A larger number would
# not even reach the server: the JSON encoder refuses integers past 64 bits (a 500).
MAX_GO_INT = 2**63 - 1


# Each error pydantic reports costs microseconds on the event loop (the error list FastAPI
# builds from it more): a 1 MiB JSON object of unknown or ill-typed members would be ~100,000
# errors, over half a second. Objects are bounded in members before their members are
# validated, in one error for the lot (lists of requests stop at their first bad item:
# ``fail_fast``).
MAX_MAP_MEMBERS = 1024
_SPARE_MEMBERS = 16  # unknown members still reported one by one, past the fields


def _few_members(value: Any) -> Any:
    if isinstance(value, dict) and len(value) > MAX_MAP_MEMBERS:
        raise PydanticCustomError(
            "too_long", "at most {max_members} members", {"max_members": MAX_MAP_MEMBERS}
        )
    return value


StrMap = Annotated[dict[str, str], BeforeValidator(_few_members)]
"""A map of strings in a request (headers, metadata): at most ``MAX_MAP_MEMBERS`` members."""


class Strict(BaseModel):
    # strict: JSON types are taken as they are, so "5", 5.0 or true is no integer and "yes"
    # or 1 no boolean; lax coercion would turn {"keep": true} into a purge keeping 1 message.
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _not_too_many_members(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + _SPARE_MEMBERS:
            raise PydanticCustomError(
                "extra_forbidden",
                "Extra inputs are not permitted: {members} members for {fields} fields",
                {"members": len(data), "fields": len(cls.model_fields)},
            )
        return data


class Message(BaseModel):
    stream: str
    subject: str
    seq: int
    time: str | None
    headers: dict[str, list[str]] = {}
    data: str = Field(description="base64")


_CODES: list[JsonValue] = [*sorted(code.value for code in ErrorCode)]


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    # Every code the gateway answers, listed in the spec. Inline: typed as the enum, the
    # schema would refer to a $defs entry that the spec's components do not have.
    code: str = Field(json_schema_extra={"enum": _CODES})
    instance: str | None = None
    nats: dict[str, Any] | None = None
