"""Reading a stream: batch reads over a sequence range, and micro-batches with sequence offsets.

A partition is a contiguous range of stream sequences, read as Arrow record batches and
handed to Spark without touching single messages: through the gateway's batch Direct Get
where the stream has ``allow_direct``, else through its consumer-backed range read
(``GET /v1/streams/{s}/messages``). Both answer the same wire format for the same range, so
partitions, schema and offsets do not depend on the path; the driver picks it from the
stream's config when it plans (option ``readVia`` forces one).
Offsets of the streaming reader are ``{"next_seq": n}``: the first sequence not read yet, so
a micro-batch ``[start, end)`` reads the same messages however often Spark replays it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline import wire, worker_logging
from pipeline.gateway import CONSUMER, DIRECT, Gateway, bounds, read_path
from pipeline.options import OptionError, Options

log = logging.getLogger("jsgw.pipeline")
PROGRESS_EVERY = 5.0  # seconds between progress lines of a reading task


@dataclass(frozen=True)
class SeqRange(InputPartition):
    """Stream sequences ``first..last`` (inclusive) of one Spark partition, and how they are
    read (``direct`` or ``consumer``)."""

    index: int
    first: int
    last: int
    via: str = DIRECT


def split(first: int, last: int, parts: int, via: str = DIRECT) -> list[SeqRange]:
    """``first..last`` cut into at most ``parts`` contiguous ranges of near-equal span."""
    span = last - first + 1
    if span <= 0:
        return []
    parts = max(1, min(parts, span))
    size, extra = divmod(span, parts)
    ranges, start = [], first
    for index in range(parts):
        end = start + size - 1 + (1 if index < extra else 0)
        ranges.append(SeqRange(index, start, end, via))
        start = end + 1
    return ranges


def choose_path(options: Options, info: dict[str, Any]) -> str:
    """``readVia``, or where it is ``auto`` the path the stream allows."""
    return read_path(info) if options.read_via == "auto" else options.read_via


def plan_range(gateway: Gateway, options: Options) -> tuple[int, int]:
    """The sequence range a batch read covers, fixed now: ``(first, last)``, maybe empty."""
    return plan(gateway, options)[:2]


def plan(gateway: Gateway, options: Options) -> tuple[int, int, str]:
    """``(first, last, via)``: the range a batch read covers, fixed now (maybe empty), and
    how it is read."""
    stream = options.target_stream
    info = gateway.stream_info(stream)
    first, last = bounds(info)
    leader = read_path(info) == CONSUMER  # no Direct Get on this stream
    start = first
    if options.start_sequence is not None:
        start = max(first, options.start_sequence)
    elif options.start_time is not None:
        found = gateway.first_seq_at(stream, options.start_time, leader=leader)
        start = found if found is not None else last + 1
    end = last
    if options.end_sequence is not None:
        end = min(last, options.end_sequence)
    elif options.end_time is not None:
        # endTime is exclusive: up to the message before the first one stored at endTime.
        found = gateway.first_seq_at(stream, options.end_time, leader=leader)
        end = min(last, found - 1) if found is not None else last
    return start, end, choose_path(options, info)


def read_messages(options: Options, part: SeqRange, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One partition of a stream read: Spark rows as Arrow record batches."""
    worker_logging()
    subject = options.subject
    # Direct Get takes a literal subject only; a consumer takes any filter.
    literal = subject is not None and (part.via == CONSUMER or wire.is_literal(subject))
    pattern = wire.subject_pattern([subject]) if subject and not literal else None
    started, count, size = time.monotonic(), 0, 0
    logged = started
    with options.connection.client() as gateway:
        for batch in gateway.read_range(
            options.target_stream,
            part.first,
            part.last,
            subject=subject if literal else None,
            max_batch=options.max_batch,
            wire=options.wire,
            via=part.via,
        ):
            if pattern is not None:
                batch = batch.filter(
                    pc.match_substring_regex(batch.column("subject"), f"^(?:{pattern.pattern})$")
                )
                if batch.num_rows == 0:
                    continue
            count += batch.num_rows
            size += batch.column("data").nbytes
            yield wire.to_stream_rows(batch, target)
            if time.monotonic() - logged >= PROGRESS_EVERY:
                logged = time.monotonic()
                log.info(
                    "stream %s partition %d: %d messages so far, at seq %d of %d..%d",
                    options.target_stream,
                    part.index,
                    count,
                    batch.column("seq")[-1].as_py(),
                    part.first,
                    part.last,
                )
    elapsed = max(time.monotonic() - started, 1e-9)
    log.info(
        "stream %s partition %d: seqs %d..%d by %s, %d messages, %.1f MB in %.1fs (%.0f msg/s)",
        options.target_stream,
        part.index,
        part.first,
        part.last,
        part.via,
        count,
        size / 1e6,
        elapsed,
        count / elapsed,
    )


class StreamBatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> list[SeqRange]:
        with self.options.connection.client() as gateway:
            first, last, via = plan(gateway, self.options)
        ranges = split(first, last, self.options.partition_count(last - first + 1), via)
        log.info(
            "stream %s: reading seqs %d..%d in %d partitions by %s",
            self.options.target_stream,
            first,
            last,
            len(ranges),
            via,
        )
        # Spark wants at least one partition; an empty range reads nothing.
        return ranges or [SeqRange(0, 1, 0)]

    def read(self, partition: SeqRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from read_messages(
            self.options, partition, wire.spark_arrow_schema(wire.stream_schema())
        )


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a stream; offsets are ``{"next_seq": n}`` (first sequence not read)."""

    def __init__(self, options: Options) -> None:
        if options.bucket is not None:
            raise OptionError("readStream reads streams: use the option 'stream'")
        self.options = options
        self._until: int | None = None  # Trigger.AvailableNow: stop at what existed then
        self._via: str | None = None  # how micro-batches read, from the latest stream info

    def _bounds(self) -> tuple[int, int]:
        with self.options.connection.client() as gateway:
            info = gateway.stream_info(self.options.target_stream)
        self._via = choose_path(self.options, info)
        return bounds(info)

    def initialOffset(self) -> dict[str, Any]:
        start = self.options.starting_offsets
        first, last = self._bounds()
        if self.options.start_time is not None:
            with self.options.connection.client() as gateway:
                found = gateway.first_seq_at(
                    self.options.target_stream,
                    self.options.start_time,
                    leader=read_path(gateway.stream_info(self.options.target_stream)) == CONSUMER,
                )
            return {"next_seq": found if found is not None else last + 1}
        if start == "earliest":
            return {"next_seq": first}
        if start == "latest":
            return {"next_seq": last + 1}
        if start.isdigit() and int(start) >= 1:
            return {"next_seq": int(start)}
        raise OptionError(
            f"option 'startingOffsets' must be earliest, latest or a sequence, got {start!r}"
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._bounds()[1] + 1

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        first, last = self._bounds()
        begin = int(start["next_seq"])
        if begin < first:
            log.warning(
                "stream %s: sequences %d..%d were removed before they were read",
                self.options.target_stream,
                begin,
                first - 1,
            )
        end = last + 1
        if self._until is not None:
            end = min(end, self._until)
        if isinstance(limit, ReadMaxRows):
            end = min(end, max(begin, first) + limit.max_rows)
        return {"next_seq": max(begin, end)}

    def reportLatestOffset(self) -> dict[str, Any]:
        return {"next_seq": self._bounds()[1] + 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SeqRange]:
        first, last = int(start["next_seq"]), int(end["next_seq"]) - 1
        if self._via is None:  # a batch replayed from the checkpoint, before any planning
            self._bounds()
        via = self._via or DIRECT
        return split(first, last, self.options.partition_count(last - first + 1), via)

    def read(self, partition: SeqRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from read_messages(
            self.options, partition, wire.spark_arrow_schema(wire.stream_schema())
        )

    def commit(self, end: dict[str, Any]) -> None:
        log.info(
            "stream %s: committed up to seq %d",
            self.options.target_stream,
            int(end["next_seq"]) - 1,
        )
