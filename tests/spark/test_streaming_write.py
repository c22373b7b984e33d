"""Streaming writes: a micro-batch replayed after a failure is stored once (Nats-Msg-Id per row)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.spark.support import make_stream, publish, read_all, run
from tests.spark.test_kv import make_bucket

_PUBLISH_OK = re.compile(
    r'^jsgw_http_requests_total\{method="POST",route="/v1/publish",status="200"\} (\S+)$', re.M
)


def _publish_requests(gateway_url: str) -> int:
    """Batch publish requests the gateway answered 200 (its own request counter)."""
    found = _PUBLISH_OK.search(httpx.get(f"{gateway_url}/metrics").text)
    return int(float(found[1])) if found else 0


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

    def start():
        return (
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

    query = start()
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
    # Restarted from the same checkpoint: the same query id, and batch 1 replayed whole (its
    # 200 rows in 10 requests of 20), of which what the failed run had stored are duplicates
    # the stream drops: it ends with the 400 messages of the source, each once (below).
    published = _publish_requests(gateway_url)
    restarted = start()
    assert restarted.awaitTermination(300) and restarted.exception() is None, restarted.exception()
    assert restarted.id == first_id
    assert _publish_requests(gateway_url) - published == 10

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
