"""The Spark data source's pure parts: options, range splitting, filters, Arrow conversions."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import options, wire
from pipeline.gateway import Connection
from pipeline.streams import split
from pipeline.writer import _headers, _key


@given(st.integers(1, 10**12), st.integers(0, 10**6), st.integers(1, 300))
def test_split_covers_the_range_in_contiguous_near_equal_parts(
    first: int, span: int, parts: int
) -> None:
    last = first + span - 1
    ranges = split(first, last, parts)
    if span == 0:
        assert ranges == []
        return
    assert ranges[0].first == first and ranges[-1].last == last
    assert len(ranges) == min(parts, span)
    for a, b in itertools.pairwise(ranges):
        assert b.first == a.last + 1
    sizes = [r.last - r.first + 1 for r in ranges]
    assert max(sizes) - min(sizes) <= 1 and [r.index for r in ranges] == list(range(len(ranges)))


@pytest.mark.parametrize(
    ("filters", "yes", "no"),
    [
        (["a.b"], ["a.b"], ["a.b.c", "a.bb", "xa.b"]),
        (["a.*"], ["a.b", "a.x"], ["a.b.c", "a", "b.a"]),
        (["a.>"], ["a.b", "a.b.c"], ["a", "b.a"]),
        (["*.x", "k.>"], ["q.x", "k.1.2"], ["q.y", "k"]),
        (["a+b.c"], ["a+b.c"], ["aab.c"]),
    ],
)
def test_subject_patterns_follow_nats_wildcards(
    filters: list[str], yes: list[str], no: list[str]
) -> None:
    pattern = wire.subject_pattern(filters)
    assert all(pattern.fullmatch(s) for s in yes)
    assert not any(pattern.fullmatch(s) for s in no)


def test_options_are_checked_with_messages_that_name_them() -> None:
    base = {"url": "http://127.0.0.1:1"}
    parsed = options.parse({**base, "Stream": "S", "PARTITIONS": "4", "token": "t"})
    assert (parsed.stream, parsed.partitions, parsed.connection.token) == ("S", 4, "t")
    assert (
        parsed.target_stream == "S"
        and options.parse({**base, "bucket": "b"}).target_stream == "KV_b"
    )
    bad = [
        ({}, "'url'"),
        (base, "one of the options 'stream' and 'bucket'"),
        ({**base, "stream": "S", "bucket": "b"}, "not both"),
        ({**base, "stream": "a.b"}, "invalid stream name"),
        ({**base, "stream": "S", "partitions": "0"}, "'partitions'"),
        ({**base, "stream": "S", "startSequence": "x"}, "'startSequence'"),
        ({**base, "bucket": "b", "keys": "a.>.b"}, "invalid key filter"),
        (
            {**base, "bucket": "b", "asOfRevision": "3", "asOfTime": "2026-01-01T00:00:00Z"},
            "exclude",
        ),
        ({**base, "bucket": "b", "includeHistory": "yes"}, "'includeHistory'"),
        ({**base, "stream": "S", "wire": "csv"}, "'wire'"),
    ]
    for given_options, message in bad:
        with pytest.raises(options.OptionError, match=message.replace("(", r"\(")):
            options.parse(given_options)
    assert options.parse(base, writing=True).stream is None
    assert options.parse({**base, "stream": "S"}).partition_count(1_000_000) == 4


def test_token_is_sent_as_a_bearer_header() -> None:
    with Connection("http://127.0.0.1:1", token="s3cret").client() as gateway:
        assert gateway.http.headers["Authorization"] == "Bearer s3cret"
    with Connection("http://127.0.0.1:1").client() as gateway:
        assert "Authorization" not in gateway.http.headers


def test_wire_batches_become_spark_rows() -> None:
    batch = wire.from_messages(
        [
            {
                "stream": "KV_b",
                "subject": "$KV.b.k.1",
                "seq": 7,
                "time": "2026-01-02T03:04:05.123456789Z",
                "headers": {},
                "data": b"v",
            },
            {
                "stream": "KV_b",
                "subject": "$KV.b.k.2",
                "seq": 9,
                "time": "2026-01-02T03:04:06Z",
                "headers": {"KV-Operation": ["DEL"]},
                "data": b"",
            },
        ]
    )
    rows = wire.to_stream_rows(batch, wire.spark_arrow_schema(wire.stream_schema()))
    assert rows.column("sequence").type == pa.int64()
    assert rows.column("timestamp").cast(pa.int64()).to_pylist() == [
        1767323045123456,
        1767323046000000,
    ]
    kv = wire.to_kv_rows(batch, "b", wire.spark_arrow_schema(wire.kv_schema())).to_pylist()
    assert [(r["key"], r["operation"], r["revision"]) for r in kv] == [
        ("k.1", "PUT", 7),
        ("k.2", "DEL", 9),
    ]


def test_written_rows_take_one_header_value_and_valid_keys() -> None:
    assert _headers([("A", "1"), ("B", ["2"]), ("C", [])]) == {"A": "1", "B": "2"}
    with pytest.raises(options.OptionError, match="2 values"):
        _headers([("A", ["1", "2"])])
    assert _key("a.b-c/d=e_f") == "a.b-c/d=e_f"
    for bad in ("_kv.x", "a..b", ".a", "a b", "a.*"):
        with pytest.raises(options.OptionError):
            _key(bad)


def test_stream_writer_ids_name_query_batch_partition_and_row() -> None:
    from pyspark.sql import types as T

    from pipeline.source import JetStreamDataSource

    headers = T.MapType(T.StringType(), T.ArrayType(T.StringType()))
    schema = T.StructType(
        [T.StructField("data", T.BinaryType()), T.StructField("headers", headers)]
    )
    source = JetStreamDataSource(
        {"url": "http://127.0.0.1:1", "stream": "B", "subject": "b.out", "writeId": "q"}
    )
    with pytest.raises(options.OptionError, match="append-only"):
        source.streamWriter(schema, True)
    writer = source.streamWriter(schema, False)
    batch = pa.record_batch(
        {"data": [b"1", b"2"], "headers": [None, [("Nats-Msg-Id", ["own"])]]},
        pa.schema(
            [("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.list_(pa.string())))]
        ),
    )
    messages = list(writer._messages(batch, "q-7-1", 40))
    assert [m["msg_id"] for m in messages] == ["q-7-1-40", "own"]
    assert {m["subject"] for m in messages} == {"b.out"}
    assert messages[0]["headers"] == {"Nats-Expected-Stream": "B"}
    # Outside a streaming task there is no batch id to build stable ids from: refused.
    with pytest.raises(RuntimeError, match="batch id"):
        writer.write(iter([batch]))
