"""Batch reads of streams through the gateway, checked against what nats-py reads."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from pipeline import jobs
from pipeline.gateway import Connection
from tests.spark.support import make_stream, parquet_rows, publish, read_all, run


def test_export_of_a_stream_equals_what_nats_py_reads(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, out: Path
) -> None:
    run(make_stream(nats_server.url, name))
    messages = [
        (
            f"{name}.{('eu', 'us', 'ap')[i % 3]}.{i % 7}",
            os.urandom(i % 300),
            {"Trace": f"t{i}", "Nats-Msg-Id": f"m{i}"} if i % 4 == 0 else None,
        )
        for i in range(2500)
    ]
    seqs = run(publish(nats_server.url, messages))
    # A hole in the middle: the export must carry on over deleted sequences.
    httpx.delete(f"{gateway_url}/v1/streams/{name}/messages/{seqs[1000]}").raise_for_status()

    summary = jobs.export_stream(
        spark, url=gateway_url, stream=name, output=str(out), partitions=3, chunk=1000
    )

    expected = run(read_all(nats_server.url, name))
    assert len(expected) == 2499
    rows = parquet_rows(out)
    assert summary.rows == len(rows) == len(expected) and summary.batches == 3
    assert (summary.first_seq, summary.last_seq) == (1, 2500)
    for row, msg in zip(rows, expected, strict=True):
        assert (row["stream"], row["subject"], row["sequence"]) == (name, msg.subject, msg.seq)
        assert row["data"] == msg.data
        assert dict(row["headers"] or []) == {k: [v] for k, v in msg.headers.items()}
        assert row["timestamp"] == msg.time_ns // 1000

    # Without allow_direct (NATS's default) the same export reads through a consumer: the
    # same partitions, the same rows.
    allow_direct(gateway_url, name, False)
    again = jobs.export_stream(
        spark, url=gateway_url, stream=name, output=str(out / "again"), partitions=3, chunk=1000
    )
    assert (again.rows, again.batches, again.first_seq, again.last_seq) == (2499, 3, 1, 2500)
    assert parquet_rows(out / "again") == rows


def allow_direct(gateway_url: str, stream: str, allow: bool) -> None:
    info = httpx.get(f"{gateway_url}/v1/streams/{stream}").raise_for_status().json()
    config = {**info["config"], "allow_direct": allow}
    httpx.put(f"{gateway_url}/v1/streams/{stream}", json=config).raise_for_status()


def test_ranges_subject_filters_and_partitions(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str
) -> None:
    # A stream without allow_direct: every read goes through the gateway's consumer path.
    run(make_stream(nats_server.url, name, allow_direct=False))
    run(publish(nats_server.url, [(f"{name}.a.{i % 2}", b"%d" % i, None) for i in range(300)]))
    middle = datetime.now(UTC).isoformat()
    run(publish(nats_server.url, [(f"{name}.b.{i % 2}", b"%d" % i, None) for i in range(300)]))

    def load(**options: str):
        reader = spark.read.format("jetstream").option("url", gateway_url).option("stream", name)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    df = load(partitions="4", startSequence="101", endSequence="500")
    assert df.rdd.getNumPartitions() == 4
    assert [r.sequence for r in df.select("sequence").collect()] == list(range(101, 501))
    literal = load(subject=f"{name}.a.1", partitions="3").select("sequence").collect()
    assert [r.sequence for r in literal] == list(range(2, 301, 2))
    wildcard = load(subject=f"{name}.*.0", startSequence="250", endSequence="360").collect()
    assert [r.sequence for r in wildcard] == list(range(251, 361, 2))
    assert {r.subject for r in wildcard} == {f"{name}.a.0", f"{name}.b.0"}
    assert [r.sequence for r in load(startTime=middle).select("sequence").collect()] == list(
        range(301, 601)
    )
    assert load(endTime=middle).count() == 300
    assert load(startSequence="601").count() == 0


def test_gateway_without_arrow_answers_ndjson_and_reads_are_equal(
    gateway_url: str, nats_server: EmbeddedServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.direct.arrow

    run(make_stream(nats_server.url, name))
    run(publish(nats_server.url, [(f"{name}.x", os.urandom(50), {"H": "v"}) for _ in range(1500)]))
    with Connection(gateway_url).client() as gateway:
        as_arrow = list(gateway.read_range(name, 3, 1400, max_batch=500))
        # The gateway serves from this process: take its pyarrow away (as on an install
        # without the extra); it answers NDJSON, which the client turns into the same batches.
        monkeypatch.setattr(app.direct.arrow, "pa", None)
        as_ndjson = list(gateway.read_range(name, 3, 1400, max_batch=500))
    assert sum(b.num_rows for b in as_arrow) == 1398

    def rows(batches: list) -> list:
        return [r for b in batches for r in b.to_pylist()]

    assert rows(as_arrow) == rows(as_ndjson)


def test_gateway_problems_fail_the_read_with_their_detail(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str
) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    run(make_stream(nats_server.url, name, allow_direct=False))
    run(publish(nats_server.url, [(f"{name}.x", b"1", None)]))
    reader = spark.read.format("jetstream").option("url", gateway_url).option("stream", name)
    assert [r.data for r in reader.load().collect()] == [b"1"]
    # Direct Get asked for on a stream without it: the gateway's refusal, word for word.
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        reader.option("readVia", "direct").load().collect()
    assert "409 direct.not_allowed" in str(caught.value)
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        spark.read.format("jetstream").option("url", gateway_url).option(
            "stream", "NOPE"
        ).load().collect()
    assert "404 stream.not_found" in str(caught.value)
