"""Extreme times and durations, as hypothesis strategies: tests/security/test_time_extremes.py
sends them to every time and duration input, and tests/contract/test_fuzz.py makes schemathesis
generate them for the spec's ``date-time`` and ``go-duration`` formats."""

from __future__ import annotations

import json
from datetime import datetime

from hypothesis import strategies as st

# -- times ------------------------------------------------------------------------------

EXTREME_TIMES = [
    "9999-12-31T23:59:59-00:01",  # the year 10000 in UTC
    "0001-01-01T00:00:00+00:01",  # the year 0 in UTC
    "9999-12-31T23:59:59+23:59",
    "0001-01-01T00:00:00-23:59",
    "9999-12-31T23:59:59.999999999Z",
    "9999-12-31T23:59:59.999999999-23:59",
    "0001-01-01T00:00:00Z",  # Go's zero time
    "0001-01-01T00:00:00.000000001Z",
    "0000-12-31T23:59:59Z",
    "10000-01-01T00:00:00Z",
    "2262-04-11T23:47:16.854775807Z",  # the last UnixNano an int64 holds
    "2262-04-11T23:47:16.854775808Z",
    "1677-09-21T00:12:43.145224191Z",  # one before the first
    "1969-12-31T23:59:59.999999999Z",
    "2016-12-31T23:59:60Z",  # a leap second
    "2020-01-01T00:00:00+24:00",
    "2020-01-01T00:00:00.1234567890123456789Z",
]


@st.composite
def rfc3339(draw: st.DrawFn) -> str:
    """RFC 3339 times near the edges: years 1, 9999 and the int64-nanosecond limits, offsets up
    to a day, up to 12 fraction digits."""
    year = draw(st.sampled_from([1, 2, 1677, 1678, 1969, 1970, 2262, 2263, 9998, 9999]))
    month = draw(st.sampled_from([1, 12]))
    day = 1 if month == 1 else 31
    clock = draw(st.sampled_from(["00:00:00", "23:59:59", "12:00:00"]))
    fraction = draw(st.sampled_from(["", ".0", ".999999", ".999999999", ".999999999999"]))
    offset = draw(
        st.one_of(
            st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
            st.builds(
                lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
                st.sampled_from("+-"),
                st.integers(0, 23),
                st.integers(0, 59),
            ),
        )
    )
    return f"{year:04d}-{month:02d}-{day:02d}T{clock}{fraction}{offset}"


TIMES = st.one_of(st.sampled_from(EXTREME_TIMES), rfc3339())

# -- durations (NATS holds them as int64 nanoseconds: at most 2562047h47m16.854775807s) --------

EXTREME_DURATION_TEXTS = [
    "2562047h47m16.854775807s",  # the largest Go duration
    "2562047h47m16.854775808s",
    "9223372036854775807ns",
    "9223372036854775808ns",
    "9223372036.854775807s",
    "9223372037s",
    "2562048h",
    "153722867m",
    "99999999999999999999999999h",
    "1" + "0" * 400 + "h",
    "0." + "0" * 400 + "1ns",
    "2562047h" * 2,
    "1h" * 3000,
    "9223372036.854775807",
    "9223372036.854775808",
    "9223372036854775807",
    "1" + "0" * 5000,
    "0.0000000001",
    "1e9",
    "1e999",
    "-1s",
    "+1s",
    "-0",
    "never",
    "0",
    "",
]
# JSON numbers, as literal text: some (1e999, 1e-400) no JSON library writes.
EXTREME_DURATION_NUMBERS = [
    "0",
    "-0.0",
    "5e-324",
    "1e-400",
    "9223372036",
    "9223372036.854775807",
    "9223372036.854775808",
    "9223372037",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "1" + "0" * 30,
    "1e308",
    "1.7976931348623157e308",
    "1e999",
    "-1",
    # not JSON, but Python's decoder takes them
    "NaN",
    "Infinity",
    "-Infinity",
]


@st.composite
def go_durations(draw: st.DrawFn) -> str:
    units = ["ns", "us", "µs", "ms", "s", "m", "h"]
    parts = draw(
        st.lists(
            st.tuples(
                st.one_of(
                    st.integers(0, 2**70).map(str),
                    st.floats(0, 1e20, allow_nan=False).map(lambda f: f"{f:.9f}"),
                ),
                st.sampled_from(units),
            ),
            min_size=1,
            max_size=4,
        )
    )
    return "".join(number + unit for number, unit in parts)


DURATION_TEXTS = st.one_of(st.sampled_from(EXTREME_DURATION_TEXTS), go_durations())
DURATION_NUMBERS = st.one_of(
    st.sampled_from(EXTREME_DURATION_NUMBERS),
    st.integers(0, 2**80).map(str),
    st.floats(0, 1e30, allow_nan=False).map(repr),
)
# A duration field takes either: a JSON string or a JSON number (as literal text).
DURATIONS = st.one_of(DURATION_TEXTS.map(json.dumps), DURATION_NUMBERS)
TIME_JSON = TIMES.map(json.dumps)

# -- for schemathesis: the formats of the spec, extremes mixed with ordinary values -------------

ORDINARY_TIMES = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda moment: moment.isoformat() + "Z"
)
ORDINARY_DURATIONS = st.builds(
    lambda number, unit: f"{number}{unit}", st.integers(0, 3600), st.sampled_from(["ms", "s", "m"])
)
FORMATS = {
    "date-time": st.one_of(TIMES, ORDINARY_TIMES),
    "go-duration": st.one_of(DURATION_TEXTS, ORDINARY_DURATIONS),
}
"""What schemathesis generates for the spec's time and duration formats."""
