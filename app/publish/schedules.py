"""Message schedules (ADR-51): the ``Nats-Schedule*`` headers of a publish, checked as
nats-server 2.14+ checks them, so that a malformed schedule is the gateway's 400 and not a
refusal from the server (which answers ``message schedules pattern is invalid`` and the like).

What the server takes (server/scheduler.go ``parseMsgSchedule``, server/cron.go): ``@at`` and
an RFC 3339 time; ``@every`` and a Go duration of at least one second; the predefined
``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``),
``@hourly``; and a cron expression of six fields (seconds to day of week: numbers, ``*`` or
``?``, ranges ``a-b``, steps ``/n``, lists ``a,b``, and month and day names). A time zone
(``Nats-Schedule-Time-Zone``, an IANA name) is taken with cron forms only. The target (and a
source) are literal subjects of the same stream, other than the schedule's own subject; the
server checks that they are in the stream. The server adds ``Nats-Rollup: sub`` to the
schedule message (one schedule per subject). nats-server 2.12 takes ``@at`` schedules with a
target and a TTL only (:func:`needs`).
"""

from __future__ import annotations

import re
from datetime import datetime

from app import errors, validation
from app.durations import NS_PER_SECOND, go_duration_ns, nats_ttl
from app.errors import ErrorCode
from app.nats import features
from app.schemas import differs, when

SCHEDULE = "Nats-Schedule"
TARGET = "Nats-Schedule-Target"
SOURCE = "Nats-Schedule-Source"
TTL = "Nats-Schedule-TTL"
TIME_ZONE = "Nats-Schedule-Time-Zone"
ROLLUP = "Nats-Schedule-Rollup"
HEADERS = (SCHEDULE, TARGET, SOURCE, TTL, TIME_ZONE, ROLLUP)

PREDEFINED = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_AT = re.compile(
    r"@at (\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})", re.ASCII
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (minimum, maximum, names) of the six cron fields, as server/cron.go bounds them.
_FIELDS: tuple[tuple[int, int, dict[str, int]], ...] = (
    (0, 59, {}),
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (1, 12, {name: i + 1 for i, name in enumerate(_MONTHS)}),
    (0, 6, {name: i for i, name in enumerate(_DAYS)}),
)
_NAMED = re.compile(r"[0-9]{1,9}|[A-Za-z]{3}", re.ASCII)
# An IANA time zone name ("Europe/Amsterdam", "UTC", "Etc/GMT+2"), as Go's LoadLocation reads
# them: no fixed offsets ("+02:00"), no empty or relative parts.
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]{0,63}(/[A-Za-z0-9_+-]{1,64}){0,3}$"
_TIME_ZONE = re.compile(TIME_ZONE_PATTERN, re.ASCII)
# What the OpenAPI document states of Nats-Schedule (its format says the rest).
SCHEDULE_PATTERN = (
    r"^(@at [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(Z|[+-][0-9]{2}:[0-9]{2})"
    r"|@every [0-9.]+[a-zµμ]+.*"
    r"|@(yearly|annually|monthly|weekly|daily|midnight|hourly)"
    r"|[0-9A-Za-z*?,/-]+( [0-9A-Za-z*?,/-]+){5})$"
)


def spec_rules(prefix: str = "", subject: str = "subject") -> list[dict[str, object]]:
    """The rules between the schedule headers (``prefix``: where they are, "headers." in a
    batch item) for ``x-jsgw-rules``."""
    named = {name: prefix + name for name in HEADERS}
    companions = "|".join(named[name] for name in HEADERS if name != SCHEDULE)
    return [
        when(named[SCHEDULE], requires=(named[TARGET],)),
        when(companions, requires=(named[SCHEDULE],)),
        when(named[TIME_ZONE], forbids=(f"{named[SCHEDULE]}^=@at |@every ",)),
        differs(named[TARGET], subject),
        differs(named[SOURCE], subject),
        differs(named[SOURCE], named[TARGET]),
    ]


def _invalid(detail: str) -> errors.InvalidInput:
    return errors.InvalidInput(ErrorCode.SCHEDULE_INVALID, detail)


def is_cron(schedule: str) -> bool:
    return not schedule.startswith(("@at ", "@every "))


def check_schedule(value: str) -> str:
    """The schedule as the server reads it; 400 ``schedule.invalid`` naming what is wrong."""
    if value.startswith("@at "):
        match = _AT.fullmatch(value)
        try:
            if match is None:
                raise ValueError
            zone = "+00:00" if match[4] == "Z" else match[4]
            datetime.fromisoformat(f"{match[1]}T{match[2]}{(match[3] or '')[:7]}{zone}")
        except ValueError:
            raise _invalid(
                f"{SCHEDULE}: {value!r} is not '@at' and an RFC 3339 time "
                "(e.g. '@at 2030-01-01T12:00:00Z')"
            ) from None
        return value
    if value.startswith("@every "):
        try:
            ns = go_duration_ns(value[len("@every ") :])
        except ValueError:
            ns = -1
        if ns < NS_PER_SECOND:
            raise _invalid(
                f"{SCHEDULE}: {value!r} is not '@every' and a duration of at least 1 s "
                "(e.g. '@every 5m')"
            )
        return value
    if value.startswith("@"):
        if value not in PREDEFINED:
            raise _invalid(
                f"{SCHEDULE}: {value!r} is not one of '@at <time>', '@every <duration>', "
                f"{', '.join(PREDEFINED)} or a six-field cron expression"
            )
        return value
    fields = value.split(" ")
    if len(fields) != len(_FIELDS):
        raise _invalid(
            f"{SCHEDULE}: {value!r} is not a cron expression of six fields separated by one "
            "space (seconds, minutes, hours, day of month, month, day of week)"
        )
    for field, bounds in zip(fields, _FIELDS, strict=True):
        if not all(_cron_range(part, *bounds) for part in field.split(",")):
            raise _invalid(f"{SCHEDULE}: cron field {field!r} of {value!r} is not valid")
    return value


def _cron_range(expr: str, low: int, high: int, names: dict[str, int]) -> bool:
    """One comma-separated part of a cron field: ``*``/``?``, ``a``, ``a-b``, each with an
    optional ``/step``, within the field's bounds (as server/cron.go getRange)."""
    span, slash, step = expr.partition("/")
    if slash and not (step.isascii() and step.isdigit() and 0 < int(step) <= 10**9):
        return False
    if span in ("*", "?"):
        return True
    first, dash, last = span.partition("-")
    start = _cron_value(first, names)
    end = _cron_value(last, names) if dash else (high if slash else start)
    return start is not None and end is not None and low <= start <= end <= high


def _cron_value(text: str, names: dict[str, int]) -> int | None:
    if _NAMED.fullmatch(text) is None:
        return None
    if text.isdigit():
        return int(text)
    return names.get(text.lower())


def checked(subject: str, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with their schedule headers checked (and a TTL normalised); those without
    ``Nats-Schedule`` come back as they are."""
    given = [name for name in HEADERS if name in headers]
    if not given:
        return headers
    if SCHEDULE not in headers:
        raise _invalid(f"{', '.join(given)} only go with {SCHEDULE}")
    schedule = check_schedule(headers[SCHEDULE].strip())
    headers[SCHEDULE] = schedule
    target = headers.get(TARGET, "").strip()
    if not target:
        raise _invalid(f"{SCHEDULE} needs {TARGET}: the subject the message is published to")
    headers[TARGET] = _subject(TARGET, target)
    if target == subject:
        raise _invalid(f"{TARGET} must be another subject than the schedule's own {subject!r}")
    if SOURCE in headers:
        source = headers[SOURCE] = _subject(SOURCE, headers[SOURCE].strip())
        if source in (subject, target):
            raise _invalid(f"{SOURCE} must differ from the schedule's subject and its target")
    if TTL in headers:
        try:
            headers[TTL] = nats_ttl(headers[TTL])
        except ValueError as exc:
            raise _invalid(f"{TTL}: {exc}") from None
    if TIME_ZONE in headers:
        zone = headers[TIME_ZONE] = headers[TIME_ZONE].strip()
        if not is_cron(schedule):
            raise _invalid(f"{TIME_ZONE} goes with cron schedules only, not {schedule!r}")
        if _TIME_ZONE.fullmatch(zone) is None:
            raise _invalid(f"{TIME_ZONE}: {zone!r} is not an IANA time zone name")
    if ROLLUP in headers and headers[ROLLUP].strip() != "sub":
        raise _invalid(f"{ROLLUP}: only 'sub' is allowed")
    return headers


def needs(headers: dict[str, str]) -> list[features.Feature]:
    """The releases' features a message's (checked) schedule headers use: "@at" with a target
    and a TTL since 2.12, the rest since 2.14."""
    schedule = headers.get(SCHEDULE)
    if schedule is None:
        return []
    if not schedule.startswith("@at ") or any(h in headers for h in (SOURCE, TIME_ZONE, ROLLUP)):
        return [features.SCHEDULES, features.REPEATING_SCHEDULES]
    return [features.SCHEDULES]


def _subject(name: str, value: str) -> str:
    try:
        return validation.publish_subject(value)
    except errors.InvalidInput as exc:
        raise _invalid(f"{name}: {exc.detail}") from None
    except errors.Forbidden as exc:
        exc.detail = f"{name}: {exc.detail}"
        raise


def targets(headers: dict[str, str]) -> tuple[str | None, str | None]:
    """The subjects a schedule publishes to and reads from (checked before)."""
    if SCHEDULE not in headers:
        return None, None
    return headers.get(TARGET), headers.get(SOURCE)


_SUBJECT_SCHEMA = {"type": "string", **validation.SCHEMAS["subject"]}
HEADER_SCHEMAS: dict[str, dict[str, object]] = {
    # "nats-schedule": the forms above (docs/api/streams.md); the pattern is their outline.
    SCHEDULE: {"type": "string", "format": "nats-schedule", "pattern": SCHEDULE_PATTERN},
    TARGET: _SUBJECT_SCHEMA,
    SOURCE: _SUBJECT_SCHEMA,
    TTL: {"type": "string", **validation.SCHEMAS["ttl"]},
    # "iana-time-zone": a name of the IANA time zone database that the server knows.
    TIME_ZONE: {"type": "string", "format": "iana-time-zone", "pattern": TIME_ZONE_PATTERN},
    ROLLUP: {"type": "string", "enum": ["sub"]},
}
DESCRIPTIONS = {
    SCHEDULE: "a message schedule (ADR-51; the stream needs allow_msg_schedules): "
    "'@at <RFC 3339>' (a delayed message), '@every <duration>' (at least 1 s), '@hourly', "
    "'@daily', '@weekly', '@monthly', '@yearly', or a six-field cron expression; the message "
    "is kept and published to Nats-Schedule-Target when due",
    TARGET: "with Nats-Schedule: the subject (of the same stream) the scheduled message is "
    "published to; the token needs write on it too",
    SOURCE: "with Nats-Schedule: publish the last message of this subject (of the same "
    "stream) instead of the schedule's own; the token needs read on it",
    TTL: "with Nats-Schedule: the Nats-TTL of the messages the schedule publishes "
    "(the stream needs allow_msg_ttl)",
    TIME_ZONE: "with a cron Nats-Schedule: the IANA time zone it runs in (UTC when not given)",
    ROLLUP: "with Nats-Schedule: 'sub' makes each published message roll up its subject",
}
