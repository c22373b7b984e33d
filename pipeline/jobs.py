"""Jobs on top of the data source: stream -> Parquet/Delta, bucket -> Parquet, table -> bucket.

The driver fixes what a job reads before the first Spark job starts (the sequence range of an
export, the revision of a snapshot) and then works through it in batches of sequences, each a
Spark job appending to the output, logging progress after each. Every batch of a snapshot is
read at the same revision, so the whole output is consistent at it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline import FORMAT, register, wire
from pipeline import options as opts
from pipeline.kv import plan_revision
from pipeline.streams import plan_range

log = logging.getLogger("jsgw.pipeline")

DEFAULT_CHUNK = 1_000_000  # sequences per Spark job


@dataclass
class Summary:
    """What a job did; also written next to the output as ``_jetstream/`` (JSON)."""

    job: str
    source: str
    output: str
    first_seq: int = 0
    last_seq: int = 0
    revision: int | None = None
    rows: int = 0
    bytes: int = 0
    batches: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _chunks(first: int, last: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(last, start + size - 1)) for start in range(first, last + 1, size)]


def _reader(spark: Any, options: dict[str, str | None]) -> Any:
    reader = spark.read.format(FORMAT)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader


def _write_batches(
    spark: Any,
    summary: Summary,
    options: dict[str, str | None],
    chunks: list[tuple[int, int]],
    *,
    output_format: str,
    mode: str,
    size_column: str,
    schema: Any,
) -> None:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    for number, (first, last) in enumerate(chunks, 1):
        batch_started = time.monotonic()
        observation = Observation(f"batch{number}")
        df = _reader(
            spark, {**options, "startSequence": str(first), "endSequence": str(last)}
        ).load()
        df = df.observe(
            observation,
            F.count(F.lit(1)).alias("rows"),
            F.coalesce(F.sum(F.length(size_column)), F.lit(0)).alias("bytes"),
        )
        df.write.format(output_format).mode(mode if number == 1 else "append").save(summary.output)
        got = observation.get
        summary.rows += int(got["rows"])
        summary.bytes += int(got["bytes"])
        summary.batches = number
        elapsed = time.monotonic() - batch_started
        log.info(
            "%s batch %d/%d: seqs %d..%d, %d rows, %.1f MB in %.1fs (%.0f rows/s); total %d rows",
            summary.job,
            number,
            len(chunks),
            first,
            last,
            got["rows"],
            got["bytes"] / 1e6,
            elapsed,
            got["rows"] / max(elapsed, 1e-9),
            summary.rows,
        )
    if not chunks and mode == "overwrite":
        # Nothing to read: still leave an (empty) table behind, with the right schema.
        spark.createDataFrame([], schema).write.format(output_format).mode(mode).save(
            summary.output
        )
    summary.seconds = time.monotonic() - started


def _write_summary(spark: Any, summary: Summary) -> None:
    record = {k: v for k, v in asdict(summary).items() if k != "extra"} | summary.extra
    # Beside the data, in a folder that Parquet readers skip (leading underscore).
    line = spark.createDataFrame([(json.dumps(record),)], "value string")
    line.coalesce(1).write.mode("overwrite").text(f"{summary.output}/_jetstream")


def export_stream(
    spark: Any,
    *,
    url: str,
    stream: str,
    output: str,
    token: str | None = None,
    subject: str | None = None,
    start_sequence: int | None = None,
    end_sequence: int | None = None,
    start_time: str | None = None,
    end_time: str | None = None,
    partitions: int | None = None,
    output_format: str = "parquet",
    mode: str = "overwrite",
    chunk: int = DEFAULT_CHUNK,
    wire_format: str = "arrow",
) -> Summary:
    """Land a stream (or a sequence/time range of it) as Parquet, or Delta with delta-spark."""
    if output_format == "delta":
        _require_delta(spark)
    register(spark)
    options = {
        "url": url,
        "token": token,
        "stream": stream,
        "subject": subject,
        "startSequence": start_sequence,
        "endSequence": end_sequence,
        "startTime": start_time,
        "endTime": end_time,
    }
    parsed = opts.parse({k: str(v) for k, v in options.items() if v is not None})
    with parsed.connection.client() as gateway:
        first, last = plan_range(gateway, parsed)
    summary = Summary("export-stream", f"stream {stream}", output, first, last)
    log.info("export-stream %s: seqs %d..%d to %s (%s)", stream, first, last, output, output_format)
    read_options = {
        "url": url,
        "token": token,
        "stream": stream,
        "subject": subject,
        "wire": wire_format,
    }
    chunks = _chunks(first, last, chunk)
    if partitions:
        read_options["partitions"] = str(partitions)
    _write_batches(
        spark,
        summary,
        read_options,
        chunks,
        output_format=output_format,
        mode=mode,
        size_column="data",
        schema=wire.stream_schema(),
    )
    _write_summary(spark, summary)
    log.info(
        "export-stream %s: %d messages, %.1f MB in %.1fs (%.0f msg/s)",
        stream,
        summary.rows,
        summary.bytes / 1e6,
        summary.seconds,
        summary.rate,
    )
    return summary


def snapshot_kv(
    spark: Any,
    *,
    url: str,
    bucket: str,
    output: str,
    token: str | None = None,
    keys: str | None = None,
    as_of_revision: int | None = None,
    as_of_time: str | None = None,
    partitions: int | None = None,
    mode: str = "overwrite",
    chunk: int = DEFAULT_CHUNK,
) -> Summary:
    """Write a bucket's state at one revision as Parquet; the revision is in the summary."""
    register(spark)
    options = {
        "url": url,
        "token": token,
        "bucket": bucket,
        "keys": keys,
        "asOfRevision": as_of_revision,
        "asOfTime": as_of_time,
    }
    parsed = opts.parse({k: str(v) for k, v in options.items() if v is not None})
    with parsed.connection.client() as gateway:
        first, revision, history = plan_revision(gateway, parsed)
    summary = Summary("snapshot-kv", f"bucket {bucket}", output, first, revision, revision)
    summary.extra["history"] = history
    log.info(
        "snapshot-kv %s: revision %d (seqs %d..%d) to %s", bucket, revision, first, revision, output
    )
    read_options = {
        "url": url,
        "token": token,
        "bucket": bucket,
        "keys": keys,
        "asOfRevision": str(revision),
    }
    if partitions:
        read_options["partitions"] = str(partitions)
    _write_batches(
        spark,
        summary,
        read_options,
        _chunks(first, revision, chunk),
        output_format="parquet",
        mode=mode,
        size_column="value",
        schema=wire.kv_schema(),
    )
    _write_summary(spark, summary)
    log.info(
        "snapshot-kv %s: %d keys at revision %d in %.1fs",
        bucket,
        summary.rows,
        revision,
        summary.seconds,
    )
    return summary


def load_kv(
    spark: Any,
    *,
    url: str,
    bucket: str,
    input_path: str,
    token: str | None = None,
    input_format: str = "parquet",
    key_column: str = "key",
    value_column: str = "value",
    write_id: str | None = None,
    partitions: int | None = None,
) -> Summary:
    """Put every row of a CSV or Parquet table into a bucket (``key`` and ``value`` columns)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    register(spark)
    reader = spark.read.format(input_format)
    if input_format == "csv":
        reader = reader.option("header", "true")
    df = reader.load(input_path)
    missing = {key_column, value_column} - set(df.columns)
    if missing:
        raise opts.OptionError(f"{input_path}: no column {sorted(missing)} (have {df.columns})")
    value = F.col(value_column)
    if dict(df.dtypes)[value_column] != "binary":
        value = value.cast("string").cast("binary")
    df = df.select(F.col(key_column).cast("string").alias("key"), value.alias("value"))
    if partitions:
        df = df.repartition(partitions)
    observation = Observation("load")
    df = df.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.length("value")), F.lit(0)).alias("bytes"),
    )
    summary = Summary("load-kv", input_path, f"bucket {bucket}")
    started = time.monotonic()
    writer = df.write.format(FORMAT).mode("append").option("url", url).option("bucket", bucket)
    if token:
        writer = writer.option("token", token)
    if write_id:
        writer = writer.option("writeId", write_id)
    writer.save()
    summary.seconds = time.monotonic() - started
    summary.rows, summary.bytes = int(observation.get["rows"]), int(observation.get["bytes"])
    summary.batches = 1
    log.info(
        "load-kv %s: %d rows, %.1f MB from %s in %.1fs (%.0f rows/s)",
        bucket,
        summary.rows,
        summary.bytes / 1e6,
        input_path,
        summary.seconds,
        summary.rate,
    )
    return summary


def _require_delta(spark: Any) -> None:
    if importlib.util.find_spec("delta") is None:
        raise opts.OptionError(
            "--format delta needs delta-spark (pip install delta-spark) and a Spark session "
            "configured for Delta Lake"
        )
