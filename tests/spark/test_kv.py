"""KV buckets read as tables: snapshots consistent at one revision, history, key filters."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import nats
import pytest

from app.nats.embedded import EmbeddedServer
from pipeline import jobs
from tests.spark.support import parquet_rows, publish, read_all, run


async def make_bucket(url: str, bucket: str, history: int) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().create_key_value(bucket=bucket, history=history, direct=True)
    finally:
        await nc.close()


def state_at(entries, bucket: str, revision: int) -> dict[str, tuple[bytes, int]]:
    """A bucket's state at a revision, computed from its history (ADR-8 operations)."""
    state: dict[str, tuple[bytes, int]] = {}
    for entry in entries:
        if entry.seq > revision:
            break
        key = entry.subject[len(f"$KV.{bucket}.") :]
        if entry.headers.get("KV-Operation") in ("DEL", "PURGE"):
            state.pop(key, None)
        else:
            state[key] = (entry.data, entry.seq)
    return state


class Writers(threading.Thread):
    """Puts and deletes random keys through nats-py until stopped."""

    def __init__(self, url: str, bucket: str, keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.bucket, self.keys = url, bucket, keys
        self.done = threading.Event()
        self.count = 0
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._write())
        except Exception as exc:  # noqa: BLE001 - handed to the test, which reports it
            self.error = exc

    async def _write(self) -> None:
        nc = await nats.connect(self.url)
        kv = await nc.jetstream().key_value(self.bucket)
        rng = random.Random(7)
        # Bounded, and slow enough that no key nears the bucket's history of 64 meanwhile.
        while not self.done.is_set() and self.count < 20_000:
            key = rng.choice(self.keys)
            if rng.random() < 0.1:
                await kv.delete(key)
            else:
                await kv.put(key, b"w%d" % self.count)
            self.count += 1
            await asyncio.sleep(0.005)
        await nc.close()


def test_snapshot_under_concurrent_writes_equals_state_at_its_revision(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str, out: Path
) -> None:
    bucket = name
    run(make_bucket(nats_server.url, bucket, history=64))
    # More keys than one multi read's 1024 subjects, also within one partition (1250 a piece).
    keys = [f"k.{i:05d}" for i in range(3000)]
    run(publish(nats_server.url, [(f"$KV.{bucket}.{k}", b"v0-" + k.encode(), None) for k in keys]))
    run(
        publish(
            nats_server.url, [(f"$KV.{bucket}.{k}", b"v1-" + k.encode(), None) for k in keys[::3]]
        )
    )
    run(
        publish(
            nats_server.url,
            [(f"$KV.{bucket}.{keys[5]}", b"", {"KV-Operation": "PURGE", "Nats-Rollup": "sub"})],
        )
    )

    writers = Writers(nats_server.url, bucket, keys)
    writers.start()
    try:
        while writers.count < 200:
            assert writers.is_alive(), writers.error
            threading.Event().wait(0.01)
        before = writers.count
        summary = jobs.snapshot_kv(
            spark, url=gateway_url, bucket=bucket, output=str(out), partitions=2, chunk=2500
        )
        during = writers.count - before
    finally:
        writers.done.set()
        writers.join(30)
    assert writers.error is None, writers.error
    assert during > 100, "the writers did not run while the snapshot was read"

    revision = summary.revision
    history = run(read_all(nats_server.url, f"KV_{bucket}", f"$KV.{bucket}.>"))
    assert history[-1].seq > revision, "no write landed after the snapshot's revision"
    expected = state_at(history, bucket, revision)
    rows = parquet_rows(out)
    got = {r["key"]: (r["value"], r["revision"]) for r in rows}
    assert len(got) == len(rows), "a key appears twice"
    assert keys[5] not in got and len(expected) > 2000
    assert got == expected
    assert {r["operation"] for r in rows} == {"PUT"} and {r["bucket"] for r in rows} == {bucket}
    assert summary.batches == 2 and summary.rows == len(expected)


def test_revision_time_history_and_key_filters(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str
) -> None:
    bucket = name
    run(make_bucket(nats_server.url, bucket, history=10))

    async def write() -> str:
        nc = await nats.connect(nats_server.url)
        kv = await nc.jetstream().key_value(bucket)
        await kv.put("a", b"a1")  # 1
        await kv.put("b", b"b1")  # 2
        await kv.put("c.x", b"c1")  # 3
        await kv.put("a", b"a2")  # 4
        await kv.delete("b")  # 5
        await asyncio.sleep(0.05)
        from datetime import UTC, datetime

        moment = datetime.now(UTC).isoformat()
        await asyncio.sleep(0.05)
        await kv.put("b", b"b2")  # 6
        await kv.put("c.x", b"c2")  # 7
        await nc.close()
        return moment

    moment = run(write())

    def load(**options: str) -> list:
        reader = spark.read.format("jetstream").option("url", gateway_url).option("bucket", bucket)
        for key, value in options.items():
            reader = reader.option(key, value)
        rows = reader.load().collect()
        return sorted((r.key, r.value, r.revision, r.operation) for r in rows)

    assert load() == [("a", b"a2", 4, "PUT"), ("b", b"b2", 6, "PUT"), ("c.x", b"c2", 7, "PUT")]
    at5 = [("a", b"a2", 4, "PUT"), ("c.x", b"c1", 3, "PUT")]
    assert load(asOfRevision="5", partitions="3") == at5
    assert load(asOfTime=moment, partitions="2") == at5
    assert load(asOfRevision="3", keys="a,c.*") == [
        ("a", b"a1", 1, "PUT"),
        ("c.x", b"c1", 3, "PUT"),
    ]
    assert load(includeHistory="true", asOfRevision="6", keys="a,b") == [
        ("a", b"a1", 1, "PUT"),
        ("a", b"a2", 4, "PUT"),
        ("b", b"", 5, "DEL"),
        ("b", b"b1", 2, "PUT"),
        ("b", b"b2", 6, "PUT"),
    ]


def test_snapshot_whose_revision_history_no_longer_holds_fails(
    spark, gateway_url: str, nats_server: EmbeddedServer, name: str
) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    bucket = name
    run(make_bucket(nats_server.url, bucket, history=2))
    subject = f"$KV.{bucket}."
    run(publish(nats_server.url, [(subject + "a", b"1", None), (subject + "b", b"1", None)]))
    # Two more values of "a" push its value at revision 2 out of the bucket's history of 2.
    run(publish(nats_server.url, [(subject + "a", b"2", None), (subject + "a", b"3", None)]))
    df = spark.read.format("jetstream").option("url", gateway_url).option("bucket", bucket)
    with pytest.raises((PySparkException, Py4JJavaError)) as caught:
        df.option("asOfRevision", "2").load().collect()
    assert "its entry at that revision may be gone" in str(caught.value)
    assert sorted(r.key for r in df.option("asOfRevision", "4").load().collect()) == ["a", "b"]
