"""Writes to streams and buckets: deterministic Nats-Msg-Id per row, problems as task errors."""

from __future__ import annotations

import csv
from pathlib import Path

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from pipeline import cli
from tests.spark.support import make_stream, parquet_rows, read_all, run
from tests.spark.test_kv import make_bucket


def _messages(gateway_url: str, stream: str) -> int:
    return httpx.get(f"{gateway_url}/v1/streams/{stream}").json()["state"]["messages"]


def test_a_task_run_twice_stores_each_row_once(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    run(make_stream(nats_server.url, name))
    marker = tmp_path / "failed-attempt"
    info_url = f"{gateway_url}/v1/streams/{name}"

    def fail_first_attempt(i: int) -> int:
        import time

        import httpx
        from pyspark import TaskContext

        if i == 1500 and TaskContext.get().attemptNumber() == 0:
            # Let the writer publish what came before, then fail the task half-way through.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                stored = httpx.get(info_url).json()["state"]["messages"]
                if stored >= 1000:
                    break
                time.sleep(0.05)
            marker.write_text(str(stored))
            raise RuntimeError("injected failure of the task's first attempt")
        return i

    check = F.udf(fail_first_attempt, LongType())
    df = spark.range(0, 4000, numPartitions=2).select(
        F.concat(F.lit("row-"), check("id").cast("string")).cast("binary").alias("data")
    )
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        (
            df.write.format("jetstream")
            .mode("append")
            .option("url", gateway_url)
            .option("subject", f"{name}.rows")
            .option("publishBatch", "100")
            .save()
        )
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)

    assert int(marker.read_text()) >= 1000, "the first attempt published nothing before failing"
    stored = run(read_all(nats_server.url, name))
    assert len(stored) == 4000
    assert sorted(m.data for m in stored) == sorted(b"row-%d" % i for i in range(4000))
    assert len({m.headers["Nats-Msg-Id"] for m in stored}) == 4000


def test_write_id_makes_a_rerun_idempotent_and_headers_pass(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str
) -> None:
    run(make_stream(nats_server.url, name))
    rows = [(f"{name}.{i % 3}", f"v{i}", {"Tenant": "acme", "Row": str(i)}) for i in range(300)]
    df = spark.createDataFrame(
        rows, "subject string, data string, headers map<string,string>"
    ).repartition(2)
    writer = df.write.format("jetstream").mode("append").option("url", gateway_url)
    writer.option("writeId", "load-7").save()
    writer.option("writeId", "load-7").save()
    assert _messages(gateway_url, name) == 300
    df.write.format("jetstream").mode("append").option("url", gateway_url).save()  # a new write id
    assert _messages(gateway_url, name) == 600

    back = (
        spark.read.format("jetstream")
        .option("url", gateway_url)
        .option("stream", name)
        .option("endSequence", "300")
        .load()
        .collect()
    )
    assert sorted(r.data.decode() for r in back) == sorted(f"v{i}" for i in range(300))
    for row in back:
        headers = dict(row.headers)
        assert headers["Tenant"] == ["acme"] and row.data == b"v" + headers["Row"][0].encode()
        assert headers["Nats-Msg-Id"][0].startswith("load-7-")
        assert row.subject == f"{name}.{int(headers['Row'][0]) % 3}"


def test_publish_problems_fail_the_write_with_their_detail(
    spark, gateway_url: str, name: str
) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    df = spark.createDataFrame([("x",)], "data string")
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        (
            df.write.format("jetstream")
            .mode("append")
            .option("url", gateway_url)
            .option("subject", f"{name}.nobody")
            .save()
        )
    assert "404 stream.no_match" in str(caught.value)
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        spark.createDataFrame([("_kv.x", "v")], "key string, value string").write.format(
            "jetstream"
        ).mode("append").option("url", gateway_url).option("bucket", name).save()
    assert "invalid KV key" in str(caught.value)


def test_load_kv_and_snapshot_kv_from_the_command_line(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, tmp_path: Path
) -> None:
    bucket = name
    run(make_bucket(nats_server.url, bucket, history=1))
    table = tmp_path / "input.csv"
    with table.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "payload"])
        out.writerows((f"user.{i}", f"value {i}") for i in range(1500))
    load = [
        "load-kv",
        "--url",
        gateway_url,
        "--bucket",
        bucket,
        "--input",
        str(table),
        "--key-column",
        "id",
        "--value-column",
        "payload",
        "--write-id",
        "users-1",
        "--partitions",
        "2",
    ]
    assert cli.main(load) == 0
    assert cli.main(load) == 0  # the same write again: nothing stored twice
    assert _messages(gateway_url, f"KV_{bucket}") == 1500
    info = httpx.get(f"{gateway_url}/v1/streams/KV_{bucket}").json()["state"]
    assert info["last_seq"] == 1500

    output = tmp_path / "snapshot"
    assert (
        cli.main(
            [
                "snapshot-kv",
                "--url",
                gateway_url,
                "--bucket",
                bucket,
                "--output",
                str(output),
                "--partitions",
                "3",
            ]
        )
        == 0
    )
    rows = parquet_rows(output)
    assert {r["key"]: r["value"] for r in rows} == {
        f"user.{i}": b"value %d" % i for i in range(1500)
    }
    assert spark.read.json(str(output / "_jetstream")).first().revision == 1500
    assert spark.sparkContext._jsc is not None, "the command stopped the caller's Spark session"
