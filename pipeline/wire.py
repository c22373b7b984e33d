"""Arrow shapes: the gateway's batch wire schema, and the rows the data source hands to Spark.

Conversions stay column-wise (pyarrow compute), so a partition never touches messages one by
one on the Arrow path.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS = pa.map_(pa.string(), pa.list_(pa.string()))


def stream_schema() -> StructType:
    """``stream, subject, sequence, timestamp, headers map<string,array<string>>, data``."""
    return StructType(
        [
            StructField("stream", StringType(), False),
            StructField("subject", StringType(), False),
            StructField("sequence", LongType(), False),
            StructField("timestamp", TimestampType()),
            StructField("headers", MapType(StringType(), ArrayType(StringType()))),
            StructField("data", BinaryType()),
        ]
    )


def kv_schema() -> StructType:
    """``bucket, key, value, revision, created, operation``."""
    return StructType(
        [
            StructField("bucket", StringType(), False),
            StructField("key", StringType(), False),
            StructField("value", BinaryType()),
            StructField("revision", LongType(), False),
            StructField("created", TimestampType()),
            StructField("operation", StringType(), False),
        ]
    )


def schema() -> pa.Schema:
    """The gateway's Arrow schema of a Direct Get batch (see app/direct/arrow.py)."""
    return pa.schema(
        [
            pa.field("stream", pa.string(), nullable=False),
            pa.field("subject", pa.string(), nullable=False),
            pa.field("seq", pa.uint64(), nullable=False),
            pa.field("time", pa.timestamp("ns", tz="UTC")),
            pa.field("headers", HEADERS),
            pa.field("data", pa.binary(), nullable=False),
        ]
    )


def from_messages(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Message JSON (``data`` already decoded) into the wire schema: the NDJSON fallback."""
    target = schema()
    times = pa.array([r.get("time") for r in rows], pa.string()).cast(target.field("time").type)
    columns = [
        pa.array([r["stream"] for r in rows], pa.string()),
        pa.array([r["subject"] for r in rows], pa.string()),
        pa.array([r["seq"] for r in rows], pa.uint64()),
        times,
        pa.array([list((r.get("headers") or {}).items()) or None for r in rows], HEADERS),
        pa.array([r["data"] for r in rows], pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def spark_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for a Spark schema (timestamps in µs, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def to_stream_rows(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Wire batch -> ``stream, subject, sequence, timestamp, headers, data``."""
    columns = [
        batch.column("stream"),
        batch.column("subject"),
        batch.column("seq").cast(pa.int64()),
        batch.column("time").cast(target.field("timestamp").type, safe=False),
        batch.column("headers").cast(target.field("headers").type),
        batch.column("data"),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def kv_operations(headers: pa.Array) -> pa.Array:
    """``KV-Operation`` of each entry (ADR-8): ``DEL``, ``PURGE``, or ``PUT`` when absent."""
    found = pc.map_lookup(headers, pa.scalar("KV-Operation"), "last")
    return pc.coalesce(pc.list_element(found, 0), pa.scalar("PUT"))


def to_kv_rows(batch: pa.RecordBatch, bucket: str, target: pa.Schema) -> pa.RecordBatch:
    """Wire batch of a ``KV_<bucket>`` stream -> ``bucket, key, value, revision, created,
    operation``."""
    prefix = len(f"$KV.{bucket}.")
    columns = [
        pa.repeat(pa.scalar(bucket, pa.string()), batch.num_rows),
        pc.utf8_slice_codeunits(batch.column("subject"), prefix),
        batch.column("data"),
        batch.column("seq").cast(pa.int64()),
        batch.column("time").cast(target.field("created").type, safe=False),
        kv_operations(batch.column("headers")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def subject_pattern(filters: list[str], *, prefix: str = "") -> re.Pattern[str]:
    """A regex matching subjects (or keys) by NATS filters with ``*`` and a final ``>``."""
    alternatives = []
    for text in filters:
        tokens = []
        for i, token in enumerate(text.split(".")):
            if token == "*":
                tokens.append(r"[^.]+")
            elif token == ">" and i == len(text.split(".")) - 1:
                tokens.append(r".+")
            else:
                tokens.append(re.escape(token))
        alternatives.append(re.escape(prefix) + r"\.".join(tokens))
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def is_literal(subject: str) -> bool:
    return all(token not in ("*", ">") for token in subject.split("."))
