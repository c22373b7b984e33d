"""Streaming writes: a micro-batch replayed after a failure is stored once (Nats-Msg-Id per row)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.spark.support import make_stream, publish, read_all, run
from tests.spark.test_kv import make_bucket

ROOT = Path(__file__).resolve().parents[2]

# The query, as the restarted driver runs it: a new process, so nothing but the checkpoint
# carries over (the query id among it). Prints the query id; a failed query exits 1.
RESTART = """
import json, sys
from pyspark.sql import SparkSession
import pipeline

url, source, sink, checkpoint = sys.argv[1:5]
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.memory", "512m")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
pipeline.register(spark)
query = (
    spark.readStream.format("jetstream").option("url", url).option("stream", source)
    .option("maxRecordsPerTrigger", "200").option("partitions", "2").load()
    .writeStream.format("jetstream").option("url", url).option("stream", sink)
    .option("subject", sink + ".out").option("publishBatch", "20")
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)
query.awaitTermination()
print(json.dumps({"id": query.id, "failed": query.exception() is not None}))
spark.stop()
"""

COMMITTED = re.compile(
    r"stream write batch (\d+) committed: (\d+) tasks, (\d+) rows, (\d+) stored, (\d+) duplicates"
)


def _stored(gateway_url: str, stream: str) -> int:
    return int(httpx.get(f"{gateway_url}/v1/streams/{stream}").json()["state"]["messages"])


def _last_seq(gateway_url: str, stream: str) -> int:
    return int(httpx.get(f"{gateway_url}/v1/streams/{stream}").json()["state"]["last_seq"])


async def _lift_size_limit(url: str, stream: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        config = (await js.stream_info(stream)).config
        config.max_msg_size = -1
        await js.update_stream(config)
    finally:
        await nc.close()


def test_a_micro_batch_replayed_by_a_restarted_query_is_stored_once(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    source, sink = f"{name}_A", f"{name}_B"
    run(make_stream(nats_server.url, source))
    # The sink refuses messages over 1 KiB: message 280 (of micro-batch 1) fails its task
    # after the messages before it were published, so the query dies in the middle of batch 1.
    # Its duplicate window covers the time to the restart (a Spark start-up on a busy machine).
    run(make_stream(nats_server.url, sink, max_msg_size=1024, duplicate_window=600))
    payloads = [b"m%04d" % i + (b"x" * 2000 if i == 279 else b"") for i in range(400)]
    run(publish(nats_server.url, [(f"{source}.in", p, None) for p in payloads]))
    checkpoint = tmp_path / "checkpoint"

    query = (
        spark.readStream.format("jetstream")
        .option("url", gateway_url)
        .option("stream", source)
        .option("maxRecordsPerTrigger", "200")
        .option("partitions", "2")
        .load()
        .writeStream.format("jetstream")
        .option("url", gateway_url)
        .option("stream", sink)
        .option("subject", f"{sink}.out")
        .option("publishBatch", "20")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match=r"message\.too_large"):
        query.awaitTermination(300)
    first_id = query.id
    before = _stored(gateway_url, sink)
    # Batch 0 is committed; batch 1 is logged as started, not committed, and part of it is in
    # the sink already.
    assert (checkpoint / "commits" / "0").exists() and not (checkpoint / "commits" / "1").exists()
    assert (checkpoint / "offsets" / "1").exists()
    assert 200 < before < 400, before

    run(_lift_size_limit(nats_server.url, sink))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    restarted = subprocess.run(
        [sys.executable, "-c", RESTART, gateway_url, source, sink, str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=600,  # a bound only: a Spark start-up on a loaded machine is slow
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert restarted.returncode == 0, restarted.stderr[-4000:]
    outcome = json.loads(restarted.stdout.strip().splitlines()[-1])
    assert outcome == {"id": first_id, "failed": False}, restarted.stderr[-4000:]

    # The restart replayed batch 1 whole: what the failed run had stored came back as duplicates.
    commits = {
        int(m[1]): tuple(int(x) for x in m.groups()[1:])
        for m in COMMITTED.finditer(restarted.stderr)
    }
    assert list(commits) == [1], restarted.stderr[-4000:]
    tasks, rows, stored, duplicates = commits[1]
    assert (tasks, rows) == (2, 200)
    assert duplicates == before - 200 and stored == 400 - before

    messages = run(read_all(nats_server.url, sink))
    assert len(messages) == 400
    assert sorted(m.data for m in messages) == payloads
    ids = [m.headers["Nats-Msg-Id"] for m in messages]
    assert len(set(ids)) == 400
    # <query>-<batch>-<partition>-<row>: batch b, partition p holds rows 200b + 100p + row.
    for message, msg_id in zip(messages, ids, strict=True):
        query_id, batch, partition, row = msg_id.rsplit("-", 3)
        assert query_id == first_id
        assert message.data[:5] == b"m%04d" % (200 * int(batch) + 100 * int(partition) + int(row))

    # Into a bucket: the same publish path, a put per row with the same kind of ids.
    bucket = f"{name}_kv"
    run(make_bucket(nats_server.url, bucket, history=1))
    query = (
        spark.readStream.format("jetstream")
        .option("url", gateway_url)
        .option("stream", source)
        .option("partitions", "2")
        .load()
        .selectExpr("concat('k.', cast(sequence as string)) as key", "data as value")
        .writeStream.format("jetstream")
        .option("url", gateway_url)
        .option("bucket", bucket)
        .option("checkpointLocation", str(tmp_path / "kv"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300) and query.exception() is None, query.exception()
    assert _last_seq(gateway_url, f"KV_{bucket}") == 400
    for seq in (1, 280, 400):
        entry = httpx.get(
            f"{gateway_url}/v1/kv/{bucket}/keys/k.{seq}", headers={"Accept": "application/json"}
        ).json()
        assert base64.b64decode(entry["value"]) == payloads[seq - 1]
