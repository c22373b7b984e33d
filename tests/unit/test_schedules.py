"""The Nats-Schedule forms the gateway takes are those nats-server's parser takes."""

from __future__ import annotations

import pytest

from app import errors
from app.nats import features
from app.publish import schedules
from app.publish.schedules import check_schedule, checked


@pytest.mark.parametrize(
    "schedule",
    [
        "@at 2030-01-01T12:00:00Z",
        "@at 2030-01-01T12:00:00.123456789+02:00",
        "@every 1s",
        "@every 1.5s",
        "@every 1h30m",
        "@yearly",
        "@annually",
        "@midnight",
        "0 0 * * * *",
        "*/5 * * * * *",
        "0 0-30/10 9-17 ? * MON-fri",
        "0 0 0 1,15 jan,jul sun",
        "59 59 23 31 12 6",
    ],
)
def test_taken(schedule: str) -> None:
    assert check_schedule(schedule) == schedule


@pytest.mark.parametrize(
    "schedule",
    [
        "@at 2030-01-01 12:00:00Z",
        "@at 2030-01-01T12:00:00",
        "@at 2030-02-30T12:00:00Z",
        "@at  2030-01-01T12:00:00Z",
        "@every 999ms",
        "@every 5",
        "@every -1h",
        "@hourly ",
        "@secondly",
        "* * * * *",
        "* * * * * * *",
        "60 * * * * *",
        "* * * 0 * *",
        "* * * * 13 *",
        "* * * * * 7",
        "* * 5-3 * * *",
        "*/0 * * * * *",
        "* * * * foo *",
        "*  * * * * *",
        "",
    ],
)
def test_refused(schedule: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        check_schedule(schedule)
    assert refused.value.code is errors.ErrorCode.SCHEDULE_INVALID


def test_headers_go_together() -> None:
    assert checked("a.b", {"X": "1"}) == {"X": "1"}
    full = {
        "Nats-Schedule": "0 0 9 * * *",
        "Nats-Schedule-Target": "a.t",
        "Nats-Schedule-Source": "a.s",
        "Nats-Schedule-TTL": "5m",
        "Nats-Schedule-Time-Zone": "America/New_York",
        "Nats-Schedule-Rollup": "sub",
    }
    assert checked("a.b", dict(full))["Nats-Schedule-TTL"] == "300s"
    for broken in (
        {"Nats-Schedule-Source": "a.t"},
        {"Nats-Schedule-Source": "a.b"},
        {"Nats-Schedule": "@every 1m"},  # with a time zone
        {"Nats-Schedule-Time-Zone": "../etc/passwd"},
        {"Nats-Schedule-TTL": "0s"},
    ):
        with pytest.raises(errors.InvalidInput):
            checked("a.b", {**full, **broken})


def test_what_each_schedule_needs_of_the_server() -> None:
    at = {"Nats-Schedule": "@at 2030-01-01T00:00:00Z", "Nats-Schedule-Target": "t"}
    assert schedules.needs({}) == []
    assert schedules.needs({**at, "Nats-Schedule-TTL": "5m"}) == [features.SCHEDULES]
    repeating = [features.SCHEDULES, features.REPEATING_SCHEDULES]
    for more in (
        {"Nats-Schedule": "@every 5m"},
        {"Nats-Schedule": "@hourly"},
        {"Nats-Schedule": "0 0 9 * * *"},
        {"Nats-Schedule-Source": "s"},
        {"Nats-Schedule-Rollup": "sub"},
        {"Nats-Schedule-Time-Zone": "UTC"},
    ):
        assert schedules.needs({**at, **more}) == repeating, more
