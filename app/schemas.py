"""What every domain's request and response models share: strictness, validated strings,
numbers, messages and problem documents (each domain keeps its own models in its package)."""

from __future__ import annotations

from typing import Annotated, Any, get_args

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
    MAX_TIME,
    MIN_TIME,
    NS_PER_SECOND,
    parse_duration_ns,
    parse_time,
    start_time_for_nats,
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


LEAST_MAX_AGE = 0.1
"""The shortest max_age (seconds) nats-server takes for a stream, and so a bucket's ttl."""


def at_least_or_zero(name: str, seconds: float, zero: str) -> AfterValidator:
    """A :data:`Duration` of at least ``seconds``, or 0 (``zero`` says what 0 means): what
    nats-server asks of a bucket's ttl (a stream's max_age) and its limit markers."""
    least = round(seconds * 1e9)

    def check(value: int) -> int:
        if 0 < value < least:
            raise ValueError(f"{name} is at least {seconds:g} s (or 0: {zero})")
        return value

    return AfterValidator(check)


# The range app.durations takes: years 1 to 9999 once in UTC (formatMinimum/formatMaximum as
# JSON Schema validators such as ajv-formats read them).
_TIME_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "formatMinimum": MIN_TIME,
    "formatMaximum": MAX_TIME,
}


def _time_for_nats(value: str) -> str:
    return time_for_nats(parse_time(value))


Time = Annotated[str, AfterValidator(_time_for_nats), WithJsonSchema(_TIME_SCHEMA)]
"""An RFC 3339 time in a request (0001-01-01 to 9999-12-31 once in UTC), passed on in the form
the JetStream API wants."""


def _start_time_for_nats(value: str) -> str:
    return start_time_for_nats(parse_time(value))


StartTime = Annotated[str, AfterValidator(_start_time_for_nats), WithJsonSchema(_TIME_SCHEMA)]
"""A :data:`Time` from which the server is to find the first message (``opt_start_time``):
one outside what its nanosecond clock holds is passed on as the nearest end of it
(app.durations.start_time_for_nats), so that it finds what the time says."""

TimeText = Annotated[str, WithJsonSchema({**_TIME_SCHEMA, "description": "RFC 3339"})]

# Either: a time, or a duration from now (a consumer's pause).
TIME_OR_DURATION_SCHEMA = {
    "anyOf": [
        {**_TIME_SCHEMA, "description": "RFC 3339 time"},
        {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_DURATION_NS // NS_PER_SECOND,
            "description": "seconds",
        },
        {"type": "string", "format": "go-duration", "examples": ["30s", "1h30m", "500ms"]},
    ],
    "description": "an RFC 3339 time, or a duration from now: seconds or a Go-style string",
}
"""An RFC 3339 time that the service checks where it uses it (a 400 naming the parameter)."""


def validated(fn: Any) -> AfterValidator:
    def run(value: Any) -> Any:
        try:
            return fn(value)
        except InvalidInput as exc:
            raise ValueError(exc.detail) from None

    return AfterValidator(run)


def checked_string(fn: Any, kind: str) -> tuple[AfterValidator, WithJsonSchema]:
    """A string checked by ``fn``, whose schema states the same rule
    (``validation.SCHEMAS[kind]``)."""
    return validated(fn), WithJsonSchema({"type": "string", **validation.SCHEMAS[kind]})


SubjectFilter = Annotated[str, *checked_string(validation.subject_filter, "subject_filter")]
Subject = Annotated[str, *checked_string(validation.subject, "subject")]
StreamName = Annotated[str, *checked_string(validation.stream_name, "stream")]
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
        if isinstance(data, dict):
            if len(data) > len(cls.model_fields) + _SPARE_MEMBERS:
                raise PydanticCustomError(
                    "extra_forbidden",
                    "Extra inputs are not permitted: {members} members for {fields} fields",
                    {"members": len(data), "fields": len(cls.model_fields)},
                )
            # JSON Schema's integers are numbers without a fraction: 1.0 is one (1.5 and true
            # still are not). Strict validation takes only 1, so 1.0 becomes 1 here.
            integral = [
                k
                for k, v in data.items()
                if type(v) is float and v.is_integer() and k in cls._ints()
            ]
            if integral:
                data = {**data, **{k: int(data[k]) for k in integral}}
        return data

    @classmethod
    def _ints(cls) -> frozenset[str]:
        found = cls.__dict__.get("_int_fields")
        if found is None:
            found = frozenset(
                name for name, field in cls.model_fields.items() if _takes_int(field.annotation)
            )
            cls._int_fields = found  # type: ignore[attr-defined]
        return found


def _takes_int(annotation: Any) -> bool:
    """Whether a field's type is an integer (or an optional one)."""
    if annotation is int:
        return True
    return any(_takes_int(arg) for arg in get_args(annotation)) and float not in get_args(
        annotation
    )


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


# -- rules between fields ------------------------------------------------------------------
#
# What JSON Schema cannot say of query parameters and headers (which one may come with which),
# or says only clumsily of bodies whose members may be null, an operation or a model states in
# ``x-jsgw-rules``: a list of the objects below, each with its ``description``. Names are
# parameters or members; "a.b" is member b of member a. A member is given when present and not
# null. tests/contract/test_fuzz.py holds the gateway to them: generated requests that keep
# them are accepted, those that break one are refused with a 4xx. The forms are documented in
# docs/api/index.md ("The OpenAPI document is the contract").


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def exclusive(*names: str) -> dict[str, Any]:
    """At most one of ``names`` is given."""
    return {"exclusive": list(names), "description": f"at most one of {_names(names)}"}


def any_of(*names: str) -> dict[str, Any]:
    """At least one of ``names`` is given."""
    return {"any_of": list(names), "description": f"at least one of {_names(names)}"}


def when(
    name: str,
    *,
    equals: Any = None,
    requires: tuple[str, ...] = (),
    forbids: tuple[str, ...] = (),
) -> dict[str, Any]:
    """When ``name`` is given (and is ``equals``, or one of them, if that is set),
    ``requires`` are given and ``forbids`` are not. An item of either may be "name=a|b":
    given with one of those values (true and false are written so; a list: holding one of
    them), "name^=a|b": a string starting with one of those, or "name>N": a number, or a
    duration in seconds, above N."""
    rule: dict[str, Any] = {"if": name}
    shown = "|".join(map(str, equals)) if isinstance(equals, list) else equals
    condition = f"`{name}`" if equals is None else f"`{name}={shown}`"
    said = []
    if equals is not None:
        rule["equals"] = equals
    if requires:
        rule["requires"] = list(requires)
        said.append(f"needs {_names(requires)}")
    if forbids:
        rule["forbids"] = list(forbids)
        said.append(f"excludes {_names(forbids)}")
    rule["description"] = f"{condition} {' and '.join(said)}"
    return rule


def duration(
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    zero: bool = False,
    half_of: str | None = None,
    default: float | None = None,
    none_when: str | None = None,
    not_above: str | None = None,
) -> dict[str, Any]:
    """A duration member's range in seconds, in whichever form it is given; ``zero``: 0 is
    allowed as well, meaning "off"; ``half_of``: at most half of that member, which is
    ``default`` when not given, or 0 when ``none_when`` is given; ``not_above``: at most that
    member when it is given and not 0."""
    rule: dict[str, Any] = {"duration": name}
    bounds = []
    if half_of is not None:
        rule["half_of"] = half_of
        said = f"at most half of `{half_of}`"
        if default is not None:
            rule["default"] = default
            said += f" ({default:g} s when not given"
            if none_when is not None:
                rule["none_when"] = none_when
                said += f", 0 with `{none_when}`"
            said += ")"
        bounds.append(said)
    if not_above is not None:
        rule["not_above"] = not_above
        bounds.append(f"at most `{not_above}`")
    if minimum is not None:
        rule["minimum"] = minimum
        bounds.append(f"at least {minimum:g} s")
    if maximum is not None:
        rule["maximum"] = maximum
        bounds.append(f"at most {maximum:g} s")
    if zero:
        rule["or_zero"] = True
    rule["description"] = f"`{name}` is {' and '.join(bounds)}" + (" (or 0)" if zero else "")
    return rule


def transform(source: str, destination: str, *, default: str = ">") -> dict[str, Any]:
    """A subject transform (republish, a source's transform), as nats-server takes it: the
    destination has no ``*`` token, ends in ``>`` exactly when the source (``default`` when
    not given) does, and its ``$N`` / ``{{wildcard(N)}}`` name the source's ``*`` tokens."""
    return {
        "transform": [source, destination],
        "default": default,
        "description": f"`{destination}` has no `*` token, ends in `>` exactly when `{source}` "
        f"(default `{default}`) does, and its `$N` or `{{{{wildcard(N)}}}}` are at most the "
        f"number of `*` tokens of `{source}`",
    }


def disjoint(name: str, member: str | None = None) -> dict[str, Any]:
    """The subject filters of list ``name`` (or their ``member``) overlap none of the others."""
    rule: dict[str, Any] = {"disjoint": name}
    if member is not None:
        rule["member"] = member
    what = f"`{name}`" if member is None else f"the `{member}` of `{name}`"
    rule["description"] = f"{what}: no two subject filters overlap"
    return rule


def colliding(
    name: str, namespaces: tuple[str, ...], *, unless: tuple[str, ...] = (), requires: str
) -> dict[str, Any]:
    """A subject filter of list ``name`` that overlaps one of ``namespaces`` (and is not
    within one of ``unless``) needs ``requires``."""
    return {
        "colliding": name,
        "namespaces": list(namespaces),
        "unless": list(unless),
        "requires": [requires],
        "description": f"a subject of `{name}` overlapping {_names(namespaces)} needs `{requires}`",
    }


def apart(
    name: str, *, subjects: str | None = None, otherwise: str, unless: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Subject filter ``name`` overlaps none of the subjects of list ``subjects``, or when
    that is not given (and none of ``unless`` is), of ``otherwise`` (a template of path
    parameters, "{stream}")."""
    rule: dict[str, Any] = {"apart": name, "otherwise": otherwise, "unless": list(unless)}
    where = f"`{otherwise}`"
    if subjects is not None:
        rule["subjects"] = subjects
        where = f"the subjects of `{subjects}` (`{otherwise}` when not given"
        where += f" and neither of {_names(unless)} is)" if unless else ")"
    rule["description"] = f"`{name}` overlaps none of {where}"
    return rule


def at_most(name: str, limit: str, *, default: float) -> dict[str, Any]:
    """Number ``name`` is at most number ``limit`` (``default`` when not given)."""
    return {
        "at_most": [name, limit],
        "default": default,
        "description": f"`{name}` is at most `{limit}` ({default:g} when not given)",
    }


def count_not_above(name: str, limit: str) -> dict[str, Any]:
    """List ``name`` has at most ``limit`` items, when ``limit`` is given and above 0."""
    return {
        "count": name,
        "not_above": limit,
        "description": f"`{name}` has at most `{limit}` items when `{limit}` is above 0",
    }


def differs(name: str, parameter: str, *, unless: str | None = None) -> dict[str, Any]:
    """Member ``name`` is not the path parameter (or member) ``parameter`` (unless ``unless``
    is given)."""
    rule: dict[str, Any] = {"differs": [name, parameter]}
    said = f"`{name}` is not `{parameter}`"
    if unless is not None:
        rule["unless"] = unless
        said += f" (unless `{unless}` is given)"
    return {**rule, "description": said}


def atomic_batch(name: str, when: str) -> dict[str, Any]:
    """When ``when`` is given, list ``name`` is an atomic batch as nats-server takes one (the
    headers of its items: ``app.publish.atomic.check_rules``)."""
    return {
        "atomic_batch": name,
        "when": when,
        "description": f"with `{when}`, the items of `{name}`: no "
        "`Nats-Expected-Last-Msg-Id`, `Nats-Expected-Last-Sequence` on the first only, a "
        "`Nats-Msg-Id` (or `msg_id`) once, no `Nats-Expected-Last-Subject-Sequence` on a "
        "subject an earlier item has",
    }


def distinct_names(name: str) -> dict[str, Any]:
    """The names of map ``name`` differ in more than letter case (header names)."""
    return {
        "distinct_names": name,
        "description": f"no two names of `{name}` differ in letter case only",
    }


def same(name: str, parameter: str) -> dict[str, Any]:
    """A body member that, when given, is the path parameter ``parameter``."""
    return {"same": [name, parameter], "description": f"`{name}`, when given, is `{parameter}`"}


def rules(*items: dict[str, Any]) -> dict[str, Any]:
    """``x-jsgw-rules`` for a model's ``json_schema_extra`` or an operation's
    ``openapi_extra``."""
    return {"x-jsgw-rules": list(items)}
