from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.durations import format_time, ns_to_seconds, parse_duration_ns, parse_time


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        (1.5, 1_500_000_000),
        (0, 0),
        ("30s", 30 * 10**9),
        ("5m", 300 * 10**9),
        ("1h30m", 5400 * 10**9),
        ("500ms", 5 * 10**8),
        ("1.5h", 5400 * 10**9),
        ("2", 2 * 10**9),
        ("0.25", 25 * 10**7),
        ("10us", 10_000),
        ("7ns", 7),
        ("0", 0),
    ],
)
def test_parse(value: object, ns: int) -> None:
    assert parse_duration_ns(value) == ns


@pytest.mark.parametrize(
    "value",
    [
        -1,
        "-1s",
        "soon",
        "1x",
        "",
        "s",
        True,
        None,
        [],
        "1h 30m",
        float("nan"),
        1e300,
        "999999999999h",
    ],
)
def test_parse_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_ns(value)


@given(st.integers(min_value=0, max_value=9_223_372_036))
def test_seconds_round_trip(seconds: int) -> None:
    assert ns_to_seconds(parse_duration_ns(seconds)) == seconds


def test_times() -> None:
    parsed = parse_time("2024-05-01T10:00:00.5Z")
    assert parsed == datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=UTC)
    assert format_time(parsed) == "2024-05-01T10:00:00.500000Z"
    assert parse_time("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    for bad in ("yesterday", "2024-05-01T10:00:00", "2024-13-01T00:00:00Z"):
        with pytest.raises(ValueError):
            parse_time(bad)
