"""Writing a DataFrame to a stream or a KV bucket through the gateway's batch publish.

Every row is published with a ``Nats-Msg-Id`` that depends only on the write, the Spark
partition and the row's place in it (``<writeId>-<partition>-<row>``), unless a ``msg_id``
column gives one. A task that Spark runs again publishes the same ids, and the stream drops
what it already stored within its duplicate window. Set the ``writeId`` option to make a whole
job's re-run idempotent too; without it each write gets a fresh id.

A streaming write (``writeStream``) does the same per micro-batch, with the ids
``<query>-<batch>-<partition>-<row>``: ``<query>`` is the streaming query's id, which Spark keeps
in the checkpoint (or ``writeId``), ``<batch>`` the micro-batch id. A batch that Spark replays
after a failure or a restart reads the same offsets into the same partitions in the same order,
so it publishes the same ids again and the stream drops the copies it already stored.
"""

from __future__ import annotations

import base64
import logging
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pipeline import worker_logging
from pipeline.gateway import GatewayError
from pipeline.options import OptionError, Options

log = logging.getLogger("jsgw.pipeline")

PROGRESS_EVERY = 5.0  # seconds between progress lines of a writing task
_KEY = re.compile(r"[-/_=a-zA-Z0-9]+(?:\.[-/_=a-zA-Z0-9]+)*")
# Spark's local properties of a streaming query's tasks (MicroBatchExecution, StreamExecution).
QUERY_ID_KEY = "sql.streaming.queryId"
BATCH_ID_KEY = "streaming.sql.batchId"


@dataclass
class WriteSummary(WriterCommitMessage):
    """What one task wrote: the commit message Spark hands back to the driver."""

    partition: int
    attempt: int
    rows: int
    stored: int
    duplicates: int
    batch_id: int | None = None  # the micro-batch of a streaming write


class PublishFailed(GatewayError):
    """The gateway refused a message of the batch; carries its problem detail."""


class RowPublisher:
    """Rows to messages, published in batches: the one write path of batch and streaming writes.

    ``write_partition`` publishes a task's rows with the ids ``<prefix>-<partition>-<row>``
    (unless a row brings its own) and returns what the task stored.
    """

    def __init__(self, options: Options, schema: StructType) -> None:
        self.options = options
        names = set(schema.fieldNames())
        if options.bucket is not None:
            missing = {"key", "value"} - names
            if missing:
                raise OptionError(
                    "writing to a bucket needs the columns key and value; "
                    f"missing {sorted(missing)}"
                )
        else:
            if "data" not in names:
                raise OptionError("writing to a stream needs a data column (binary or string)")
            if options.subject is None and "subject" not in names:
                raise OptionError("give the option 'subject' or a subject column")
            if options.subject is not None and not all(options.subject.split(".")):
                raise OptionError(f"invalid subject {options.subject!r}")
        self.has_headers = "headers" in names
        self.has_msg_id = "msg_id" in names

    def write_partition(
        self, iterator: Iterator[pa.RecordBatch], prefix: str, batch_id: int | None = None
    ) -> WriteSummary:
        from pyspark import TaskContext

        worker_logging()
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        summary = WriteSummary(partition, attempt, 0, 0, 0, batch_id)
        self._prefix = prefix
        self._logged = time.monotonic()
        pending: list[dict[str, Any]] = []
        with self.options.connection.client() as gateway:
            for batch in iterator:
                for message in self._messages(batch, f"{prefix}-{partition}", summary.rows):
                    pending.append(message)
                    summary.rows += 1
                    if len(pending) >= self.options.publish_batch:
                        self._flush(gateway, pending, summary)
            if pending:
                self._flush(gateway, pending, summary)
        log.info(
            "write %s partition %d (attempt %d): %d rows, %d stored, %d duplicates",
            prefix,
            partition,
            attempt,
            summary.rows,
            summary.stored,
            summary.duplicates,
        )
        return summary

    def _messages(
        self, batch: pa.RecordBatch, prefix: str, offset: int
    ) -> Iterator[dict[str, Any]]:
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        bucket = self.options.bucket
        for row in range(batch.num_rows):
            if bucket is not None:
                subject = f"$KV.{bucket}.{_key(columns['key'][row])}"
                data = columns["value"][row]
            else:
                subject = self.options.subject or columns["subject"][row]
                data = columns["data"][row]
            message: dict[str, Any] = {"subject": subject, "data": _b64(data)}
            headers = _headers(columns["headers"][row]) if self.has_headers else {}
            msg_id = columns["msg_id"][row] if self.has_msg_id else None
            msg_id = msg_id or headers.pop("Nats-Msg-Id", None) or f"{prefix}-{offset + row}"
            headers.pop("Nats-Msg-Id", None)
            if self.options.stream is not None:
                # The stream named in the options must be the one that stores the message.
                headers["Nats-Expected-Stream"] = self.options.stream
            if headers:
                message["headers"] = headers
            message["msg_id"] = msg_id
            yield message

    def _flush(self, gateway: Any, pending: list[dict[str, Any]], summary: WriteSummary) -> None:
        results = gateway.publish_batch(pending)
        failed = [r for r in results if not r.get("ok")]
        if failed:
            first = failed[0]
            problem = first.get("error") or {}
            message = pending[first["index"]]
            raise PublishFailed.from_problem(
                f"publish to {message['subject']!r} (msg id {message['msg_id']}, "
                f"{len(failed)} of {len(pending)} messages refused)",
                problem,
            )
        for result in results:
            if result["ack"].get("duplicate"):
                summary.duplicates += 1
            else:
                summary.stored += 1
        pending.clear()
        if time.monotonic() - self._logged >= PROGRESS_EVERY:
            self._logged = time.monotonic()
            log.info(
                "write %s partition %d: %d rows published so far (%d duplicates)",
                self._prefix,
                summary.partition,
                summary.rows,
                summary.duplicates,
            )


class JetStreamWriter(RowPublisher, DataSourceArrowWriter):
    """``df.write``: ids ``<writeId>-<partition>-<row>``, a fresh ``writeId`` unless given."""

    def __init__(self, options: Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("streams and buckets are append-only: use mode('append')")
        super().__init__(options, schema)
        self.write_id = options.write_id or uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        return self.write_partition(iterator, self.write_id)

    def commit(self, messages: list[WriteSummary | None]) -> None:  # type: ignore[override]
        done = [m for m in messages if m is not None]
        log.info(
            "write %s committed: %d tasks, %d rows, %d stored, %d duplicates",
            self.write_id,
            len(done),
            sum(m.rows for m in done),
            sum(m.stored for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriteSummary | None]) -> None:  # type: ignore[override]
        done = [m for m in messages if m is not None]
        log.error(
            "write %s aborted after %d tasks had stored %d rows (re-run with writeId=%s "
            "to skip them as duplicates)",
            self.write_id,
            len(done),
            sum(m.stored for m in done),
            self.write_id,
        )


class JetStreamStreamWriter(RowPublisher, DataSourceStreamArrowWriter):
    """``df.writeStream``: ids ``<query>-<batch>-<partition>-<row>``, the same in a replay.

    ``<query>`` is the ``writeId`` option or else the streaming query's id, which Spark stores
    in the checkpoint, so it survives a restart (the run id does not); ``<batch>`` is the
    micro-batch id. Both reach the task as Spark's local properties.
    """

    def __init__(self, options: Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("streams and buckets are append-only: use outputMode('append')")
        super().__init__(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_KEY) if context else None
        query = self.options.write_id or (
            context.getLocalProperty(QUERY_ID_KEY) if context else None
        )
        if batch is None or query is None:
            raise RuntimeError(
                "a streaming write task without its query and batch id "
                f"(Spark's local properties {QUERY_ID_KEY!r}, {BATCH_ID_KEY!r}): "
                "message ids would not be stable across a replay"
            )
        return self.write_partition(iterator, f"{query}-{batch}", int(batch))

    def commit(self, messages: list[WriteSummary | None], batchId: int) -> None:  # type: ignore[override]
        worker_logging()
        done = [m for m in messages if m is not None]
        log.info(
            "stream write batch %d committed: %d tasks, %d rows, %d stored, %d duplicates",
            batchId,
            len(done),
            sum(m.rows for m in done),
            sum(m.stored for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriteSummary | None], batchId: int) -> None:  # type: ignore[override]
        worker_logging()
        done = [m for m in messages if m is not None]
        log.error(
            "stream write batch %d aborted after %d tasks had stored %d rows (the query's "
            "restart from its checkpoint publishes the batch again; the stream drops the "
            "copies within its duplicate window)",
            batchId,
            len(done),
            sum(m.stored for m in done),
        )


def _b64(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        value = value.encode()
    return base64.b64encode(value).decode()


def _key(value: Any) -> str:
    key = value if isinstance(value, str) else str(value)
    if not _KEY.fullmatch(key) or key.startswith("_kv"):
        raise OptionError(
            f"invalid KV key {key!r} (ADR-8: letters, digits, -/_=. ; not starting with _kv)"
        )
    return key


def _headers(value: Any) -> dict[str, str]:
    """A headers cell, map<string,string> or map<string,array<string>>, as one value per name."""
    out: dict[str, str] = {}
    for name, values in value or []:
        if isinstance(values, list):
            if len(values) > 1:
                raise OptionError(
                    f"header {name!r} has {len(values)} values; publish takes one per name"
                )
            if not values:
                continue
            values = values[0]
        out[name] = values
    return out
