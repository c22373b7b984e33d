"""A KV bucket as a table: a snapshot consistent at one revision, or its history up to it.

The revision ``R`` is fixed when Spark plans the read and travels inside every partition.
Partitions are sequence ranges of the bucket's stream ``KV_<bucket>`` up to ``R``; each reads
its range with batch Direct Get and keeps, per key, the last entry it saw. A key's value at
``R`` is the last entry of that key at or before ``R``, which lies in exactly one range, so the
partitions' results are disjoint and no shuffle is needed. To know whether a later entry (still
at or before ``R``) lives in another range, a partition asks one consistent multi-subject read
pinned to ``R`` (``POST /direct/multi`` with ``up_to_seq``) for the keys it holds; the gateway
splits lists over the server's 1024-subject limit, so bucket size is not capped.

A value current at ``R`` must still be stored while the snapshot is read: a key updated
``history`` times after ``R`` (or purged after ``R``) has lost it. Each partition checks for this
after reading its range: its entries must still be the keys' entries at ``R``, and the entries
written after ``R`` (the tail, short while the read is quick) must not contain ``history``
updates of one key or a purge. Otherwise it fails with an error that says so, rather than
return a mix of revisions. (The check is conservative: a key created after ``R`` and updated
``history`` times also fails it. Entries removed by the bucket's TTL are not detected.)
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipeline import wire, worker_logging
from pipeline.gateway import Gateway, GatewayError, bounds
from pipeline.options import Options
from pipeline.streams import split

log = logging.getLogger("jsgw.pipeline")

MULTI_CHUNK = 2000  # keys per multi read request (the gateway pins all chunks to R)


@dataclass(frozen=True)
class KvRange(InputPartition):
    index: int
    first: int
    last: int
    revision: int
    history: int  # the bucket's max_msgs_per_subject; 0 when unlimited


class SnapshotLost(GatewayError):
    """An entry current at the snapshot's revision was removed before it could be read."""


def plan_revision(gateway: Gateway, options: Options) -> tuple[int, int, int]:
    """``(first_seq, revision, history)``: the revision the read is consistent at, fixed now."""
    stream = options.target_stream
    info = gateway.stream_info(stream)
    history = max(0, int((info.get("config") or {}).get("max_msgs_per_subject") or 0))
    first, last = bounds(info)
    revision = last
    if options.as_of_revision is not None:
        if options.as_of_revision > last:
            raise GatewayError(
                f"bucket {options.bucket}: asOfRevision {options.as_of_revision} is ahead of "
                f"the bucket's last revision {last}"
            )
        revision = options.as_of_revision
    elif options.as_of_time is not None:
        found = gateway.first_seq_at(stream, options.as_of_time)
        revision = min(last, found - 1) if found is not None else last
    return first, revision, history


class KvReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> list[KvRange]:
        with self.options.connection.client() as gateway:
            first, revision, history = plan_revision(gateway, self.options)
        # startSequence/endSequence narrow the read to part of the bucket (jobs read in chunks).
        first = max(first, self.options.start_sequence or first)
        last = min(revision, self.options.end_sequence or revision)
        ranges = split(first, last, self.options.partition_count(last - first + 1))
        log.info(
            "bucket %s: %s at revision %d (seqs %d..%d) in %d partitions",
            self.options.bucket,
            "history" if self.options.include_history else "snapshot",
            revision,
            first,
            last,
            len(ranges),
        )
        parts = [KvRange(r.index, r.first, r.last, revision, history) for r in ranges]
        return parts or [KvRange(0, 1, 0, revision, history)]

    def read(self, partition: KvRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        worker_logging()
        target = wire.spark_arrow_schema(wire.kv_schema())
        started = time.monotonic()
        with self.options.connection.client() as gateway:
            rows = list(self._entries(gateway, partition.first, partition.last, target))
            if not self.options.include_history:
                rows = self._latest(gateway, partition, rows)
                self._check_tail(gateway, partition)
        count = sum(b.num_rows for b in rows)
        log.info(
            "bucket %s partition %d: seqs %d..%d at revision %d, %d rows in %.1fs",
            self.options.bucket,
            partition.index,
            partition.first,
            partition.last,
            partition.revision,
            count,
            time.monotonic() - started,
        )
        yield from rows

    def _entries(
        self, gateway: Gateway, first: int, last: int, target: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        """The bucket's entries with sequences ``first..last`` that match the key filters."""
        bucket = self.options.bucket or ""
        pattern = (
            f"^(?:{wire.subject_pattern(list(self.options.keys)).pattern})$"
            if self.options.keys
            else None
        )
        for batch in gateway.read_range(
            self.options.target_stream,
            first,
            last,
            max_batch=self.options.max_batch,
            wire=self.options.wire,
        ):
            rows = wire.to_kv_rows(batch, bucket, target)
            if pattern is not None:
                rows = rows.filter(pc.match_substring_regex(rows.column("key"), pattern))
            if rows.num_rows:
                yield rows

    def _latest(
        self, gateway: Gateway, part: KvRange, batches: list[pa.RecordBatch]
    ) -> list[pa.RecordBatch]:
        """The entries of this range that are their key's last at the revision, minus deletes."""
        if not batches:
            return []
        table = pa.Table.from_batches(batches)
        keys = table.column("key").to_pylist()
        last_index = {key: i for i, key in enumerate(keys)}  # entries come in sequence order
        if part.last < part.revision:
            revisions = table.column("revision").to_pylist()
            mine = {key: revisions[i] for key, i in last_index.items()}
            current = self._revisions_at(gateway, part, list(mine))
            for key, revision in mine.items():
                at_r = current.get(key)
                if at_r is None or at_r < revision:
                    raise SnapshotLost(
                        f"bucket {self.options.bucket}: the entry of key {key!r} at revision "
                        f"{revision} was removed while the snapshot at revision {part.revision} "
                        "was read (the key changed more often than the bucket's history keeps); "
                        "read again, or raise the bucket's history"
                    )
                if at_r != revision:
                    del last_index[key]  # a later entry, in a later range, is the one at R
        picked = table.take(pa.array(sorted(last_index.values()), pa.int64()))
        picked = picked.filter(pc.equal(picked.column("operation"), "PUT"))
        latest: list[pa.RecordBatch] = picked.combine_chunks().to_batches()
        return latest

    def _check_tail(self, gateway: Gateway, part: KvRange) -> None:
        """Fail if an entry current at the revision may have been removed since it was fixed."""
        bucket = self.options.bucket or ""
        target = wire.spark_arrow_schema(wire.kv_schema())
        updates: Counter[str] = Counter()
        for rows in self._entries(gateway, part.revision + 1, 2**63 - 1, target):
            keys, operations = rows.column("key").to_pylist(), rows.column("operation").to_pylist()
            for key, operation in zip(keys, operations, strict=True):
                updates[key] += 1
                if operation == "PURGE" or (part.history and updates[key] >= part.history):
                    what = "purged" if operation == "PURGE" else f"updated {updates[key]} times"
                    raise SnapshotLost(
                        f"bucket {bucket}: key {key!r} was {what} after revision {part.revision}, "
                        f"so its entry at that revision may be gone (the bucket keeps "
                        f"{part.history} per key); read again, or raise the bucket's history"
                    )

    def _revisions_at(self, gateway: Gateway, part: KvRange, keys: list[str]) -> dict[str, int]:
        """Each key's last revision at or before the snapshot's revision."""
        prefix = f"$KV.{self.options.bucket}."
        out: dict[str, int] = {}
        for start in range(0, len(keys), MULTI_CHUNK):
            subjects = [prefix + key for key in keys[start : start + MULTI_CHUNK]]
            for message in gateway.multi_last(self.options.target_stream, subjects, part.revision):
                out[message["subject"][len(prefix) :]] = int(message["seq"])
        return out
