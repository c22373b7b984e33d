"""Export throughput (issue 9): the Spark job through the gateway vs a nats-py ordered consumer.

    .venv/bin/python -m bench.spark_export [--messages 300000] [--size 256] [--partitions 2]

One run, on 127.0.0.1 only, with temporary stores: a nats-server, the gateway
(``python -m app serve``, access log off) and a local Spark session (``local[2]``). One stream
is filled with ``--messages`` messages of ``--size`` random bytes, then dumped to Parquet
(the same columns) three ways, each timed from the start of the read to the closed files:

* nats-py: one ordered push consumer, record batches of 10,000 rows written with pyarrow;
* Spark, Direct Get, Arrow: ``jsgw-pipeline export-stream``'s job, partitions reading batch
  Direct Get answered as Arrow IPC;
* Spark, Direct Get, NDJSON: the same job with ``wire=ndjson`` (per-message JSON + base64);
* Spark, consumer, Arrow / NDJSON: the same stream with ``allow_direct`` turned off, so the
  partitions read through the gateway's consumer-backed range read
  (``GET /v1/streams/{s}/messages``).

The Spark session is started and warmed up (one small export by each path) before it is
timed: JVM start and the first Python worker are not part of an export's throughput. On this
2-core machine Spark, the gateway and nats-server share the two cores; on a cluster the
partitions scale out. Each row also gives the CPU seconds the gateway process spent and the
machine's busy CPU seconds (all processes, both cores) during that export, and the run ends
with the load average, since other work on the machine skews the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nats
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from nats.js.api import StreamConfig

from app.nats.embedded import EmbeddedServer
from bench.procs import Procs, cpu_seconds, machine_busy_seconds, start_gateway

SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("subject", pa.string()),
        ("sequence", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
        ("data", pa.binary()),
    ]
)


async def allow_direct(url: str, stream: str, allow: bool) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    config = (await js.stream_info(stream)).config
    config.allow_direct = allow
    await js.update_stream(config)
    await nc.close()


async def fill(url: str, stream: str, count: int, size: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.>"], allow_direct=True))
    payloads = [os.urandom(size) for _ in range(64)]
    for start in range(0, count, 2000):
        await asyncio.gather(
            *(
                js.publish(f"{stream}.{i % 16}", payloads[i % 64])
                for i in range(start, min(count, start + 2000))
            )
        )
    await nc.close()


async def nats_py_dump(url: str, stream: str, count: int, output: Path) -> float:
    """Every message through one ordered consumer into Parquet; returns seconds."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    started = time.perf_counter()
    sub = await js.subscribe(
        f"{stream}.>",
        ordered_consumer=True,
        pending_msgs_limit=100_000,
        pending_bytes_limit=256 * 1024 * 1024,
    )
    writer = pq.ParquetWriter(str(output / "part-0.parquet"), SCHEMA)
    subjects: list[str] = []
    seqs: list[int] = []
    times: list[int] = []
    data: list[bytes] = []

    def flush() -> None:
        n = len(seqs)
        writer.write_batch(
            pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(stream), n),
                    pa.array(subjects),
                    pa.array(seqs, pa.int64()),
                    pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                    pa.nulls(n, SCHEMA.field("headers").type),
                    pa.array(data, pa.binary()),
                ],
                schema=SCHEMA,
            )
        )
        subjects.clear(), seqs.clear(), times.clear(), data.clear()

    received = 0
    while received < count:
        msg = await sub.next_msg(timeout=10)
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>
        tokens = msg.reply.split(".")
        subjects.append(msg.subject)
        seqs.append(int(tokens[-4]))
        times.append(int(tokens[-2]) // 1000)
        data.append(msg.data)
        received += 1
        if len(seqs) >= 10_000:
            flush()
    if seqs:
        flush()
    writer.close()
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    await nc.close()
    return elapsed


def spark_session():  # type: ignore[no-untyped-def]
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("jsgw-bench-export")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_in(path: Path) -> int:
    return ds.dataset(str(path), format="parquet").count_rows()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=256, help="payload bytes per message")
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()

    from pipeline import jobs

    work = Path(tempfile.mkdtemp(prefix="jsgw-spark-bench-"))
    server = EmbeddedServer(work / "nats", log_file=work / "nats.log")
    procs = Procs()
    try:
        server.start()
        # The gateway as users run it: its defaults (the access log on, to a file here).
        gateway, url = start_gateway(procs, server.url, work, env={"JSGW_LOG_LEVEL": "warning"})

        stream = "BENCH"
        print(f"filling {args.messages} messages of {args.size} bytes ...", file=sys.stderr)
        asyncio.run(fill(server.url, stream, args.messages, args.size))
        asyncio.run(fill(server.url, "WARMUP", 2000, args.size))
        megabytes = args.messages * args.size / 1e6

        # (label, seconds, gateway CPU seconds, machine busy CPU seconds)
        results: list[tuple[str, float, float, float]] = []
        out = work / "nats-py"
        out.mkdir()
        busy = machine_busy_seconds()
        seconds = asyncio.run(nats_py_dump(server.url, stream, args.messages, out))
        results.append(
            (
                "nats-py ordered consumer → Parquet (1 process)",
                seconds,
                0.0,
                machine_busy_seconds() - busy,
            )
        )
        assert rows_in(out) == args.messages

        load_start = os.getloadavg()[0]
        spark = spark_session()
        for via in ("direct", "consumer"):
            asyncio.run(allow_direct(server.url, "WARMUP", via == "direct"))
            jobs.export_stream(
                spark, url=url, stream="WARMUP", output=str(work / f"warmup-{via}"), partitions=2
            )
        for via in ("direct", "consumer"):
            # The data source picks the path from the stream's config: Direct Get where it
            # is allowed, the consumer-backed range read where not.
            asyncio.run(allow_direct(server.url, stream, via == "direct"))
            for wire in ("arrow", "ndjson"):
                target = work / f"spark-{via}-{wire}"
                gateway_cpu, busy = cpu_seconds(gateway.pid), machine_busy_seconds()
                summary = jobs.export_stream(
                    spark,
                    url=url,
                    stream=stream,
                    output=str(target),
                    partitions=args.partitions,
                    wire_format=wire,
                )
                gateway_cpu = cpu_seconds(gateway.pid) - gateway_cpu
                busy = machine_busy_seconds() - busy
                assert summary.rows == rows_in(target) == args.messages, (summary, rows_in(target))
                wire_name = "Arrow IPC" if wire == "arrow" else "NDJSON"
                path = "Direct Get" if via == "direct" else "consumer (no allow_direct)"
                label = f"Spark export-stream, {args.partitions} partitions, {path}, {wire_name}"
                results.append((label, summary.seconds, gateway_cpu, busy))
        spark.stop()

        base = results[0][1]
        print(
            f"\n### Stream export: {args.messages:,} messages × {args.size} B "
            f"({megabytes:.0f} MB of payload), 2 cores shared by all\n"
        )
        print(
            "| reader | seconds | messages/s | MB/s | vs nats-py | gateway CPU s | machine CPU s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, seconds, gateway_cpu, busy in results:
            print(
                f"| {label} | {seconds:.2f} | {args.messages / seconds:,.0f} | "
                f"{megabytes / seconds:.1f} | {base / seconds:.2f}× | "
                f"{gateway_cpu:.1f} | {busy:.1f} |"
            )
        print(f"\nload average before Spark started: {load_start:.2f} (1 min)")
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (1 min)")
        return 0
    finally:
        procs.stop_all()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
