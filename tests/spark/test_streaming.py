"""Streaming reads: sequence offsets, a limit per trigger, exactly-once across a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from app.nats.embedded import EmbeddedServer
from tests.spark.support import make_stream, publish, run


def test_query_restarted_from_its_checkpoint_delivers_every_message_once(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, tmp_path: Path
) -> None:
    run(make_stream(nats_server.url, name))
    run(publish(nats_server.url, [(f"{name}.a", b"first %d" % i, None) for i in range(1000)]))
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start(trigger: dict):
        stream = (
            spark.readStream.format("jetstream")
            .option("url", gateway_url)
            .option("stream", name)
            .option("maxRecordsPerTrigger", "200")
            .option("partitions", "2")
            .load()
        )
        return (
            stream.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "0 seconds"})
    deadline = time.monotonic() + 120
    while len([p for p in query.recentProgress if p["numInputRows"]]) < 2:
        assert query.exception() is None and time.monotonic() < deadline, query.exception()
        time.sleep(0.1)
    query.stop()  # mid-stream: some of the 1000 are not read yet
    first_run = [p for p in query.recentProgress if p["numInputRows"]]
    assert all(p["numInputRows"] <= 200 for p in first_run)
    assert sum(p["numInputRows"] for p in first_run) < 1000
    assert json.loads(first_run[0]["sources"][0]["endOffset"]) == {"next_seq": 201}

    run(publish(nats_server.url, [(f"{name}.b", b"second %d" % i, None) for i in range(200)]))
    # Restarted on a stream that no longer allows Direct Get: the rest is read through the
    # gateway's consumer path, from the same offsets.
    info = httpx.get(f"{gateway_url}/v1/streams/{name}").raise_for_status().json()
    config = {**info["config"], "allow_direct": False}
    httpx.put(f"{gateway_url}/v1/streams/{name}", json=config).raise_for_status()
    again = start({"availableNow": True})
    assert again.awaitTermination(180)
    assert again.exception() is None
    resumed = [p for p in again.recentProgress if p["numInputRows"]]
    assert resumed and all(p["numInputRows"] <= 200 for p in resumed)

    rows = spark.read.parquet(str(sink)).select("sequence", "subject", "data").collect()
    assert sorted(r.sequence for r in rows) == list(range(1, 1201))
    by_seq = {r.sequence: r for r in rows}
    assert by_seq[1000].data == b"first 999" and by_seq[1001].data == b"second 0"
    assert by_seq[1200].subject == f"{name}.b"
