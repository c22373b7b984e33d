from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.consumers.schemas import ConsumerConfig
from app.durations import (
    format_time,
    ns_from_time,
    ns_to_seconds,
    parse_duration_ns,
    parse_time,
    start_time_for_nats,
    time_for_nats,
)
from app.streams.schemas import StreamSource


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
        (9_223_372_036, 9_223_372_036 * 10**9),  # the schema's maximum in seconds
        ("2562047h47m16.854775807s", 2**63 - 1),
        (1e-300, 1),  # a positive number stays positive
        (4e-10, 1),
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
        9_223_372_036.000004,  # over the schema's maximum, though within int64 ns
        "9223372036.5",
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


@pytest.mark.parametrize(
    "value",
    [
        "9999-12-31T23:59:59-00:01",  # the year 10000 once in UTC
        "0001-01-01T00:00:00+00:01",  # the year 0 once in UTC
        "9999-12-31T23:59:59.999999-23:59",
    ],
)
def test_times_out_of_range_once_in_utc_are_value_errors(value: str) -> None:
    with pytest.raises(ValueError, match="outside 0001-01-01T00:00:00Z to 9999-12-31"):
        parse_time(value)


EARLIEST = "1970-01-01T00:00:00.000000Z"  # where start times are held to (the epoch)
LATEST = "2262-04-11T23:47:16.854775Z"  # the server's int64 nanoseconds, to the microsecond


@pytest.mark.parametrize(
    ("value", "sent", "start"),
    [
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000000Z", EARLIEST),
        ("0001-01-01T23:59:00+23:59", "0001-01-01T00:00:00.000000Z", EARLIEST),
        ("0999-05-01T00:00:00Z", "0999-05-01T00:00:00.000000Z", EARLIEST),
        ("1500-01-01T00:00:00Z", "1500-01-01T00:00:00.000000Z", EARLIEST),
        (
            "1970-01-01T00:00:00.000001Z",
            "1970-01-01T00:00:00.000001Z",
            "1970-01-01T00:00:00.000001Z",
        ),
        ("2262-04-11T23:47:16.854775Z", LATEST, LATEST),
        ("2262-04-11T23:47:16.854776Z", "2262-04-11T23:47:16.854776Z", LATEST),
        ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z", LATEST),
        ("2024-05-01T12:00:00+02:00", "2024-05-01T10:00:00.000000Z", "2024-05-01T10:00:00.000000Z"),
    ],
)
def test_times_for_nats(value: str, sent: str, start: str) -> None:
    # Four-digit years (strftime's %Y gives "1" for the year 1 on glibc, which the server
    # cannot parse). A start time stays within the server's clock: nats-server finds its
    # message by int64 nanoseconds, and outside 1678-2262 times wrap.
    assert time_for_nats(parse_time(value)) == sent
    assert start_time_for_nats(parse_time(value)) == start


@given(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)),
    st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1),
)
def test_any_rfc3339_time_parses_or_is_a_value_error(moment: datetime, minutes: int) -> None:
    sign = "-" if minutes < 0 else "+"
    text = moment.isoformat() + f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    try:
        parsed = parse_time(text)
    except ValueError:
        return
    assert parsed.tzinfo is UTC
    assert len(time_for_nats(parsed)) == len("2024-05-01T10:00:00.000000Z")


def test_a_time_in_nanoseconds_is_exact_on_both_sides_of_the_epoch() -> None:
    assert ns_from_time(parse_time("2026-11-22T14:30:27.810762Z")) == (1_795_357_827_810_762_000)
    assert ns_from_time(parse_time("1969-12-31T23:59:58.5Z")) == -1_500_000_000
    assert ns_from_time(parse_time("1970-01-01T01:00:00+01:00")) == 0


def test_config_start_times_are_sent_within_the_servers_clock() -> None:
    # A consumer's or a stream source's opt_start_time: where the server starts; pause_until
    # is compared as a time, and kept as given.
    source = StreamSource(name="S", opt_start_time="2999-01-01T00:00:00Z")
    assert source.opt_start_time == "2262-04-11T23:47:16.854775Z"
    consumer = ConsumerConfig(
        opt_start_time="1500-01-01T00:00:00Z", pause_until="2999-01-01T00:00:00Z"
    )
    assert consumer.opt_start_time == "1970-01-01T00:00:00.000000Z"
    assert consumer.pause_until == "2999-01-01T00:00:00.000000Z"
