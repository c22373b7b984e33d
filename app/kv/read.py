"""Consistent multi-key reads of a bucket: every entry as of one revision (ADR-31 multi_last;
where Direct Get cannot answer, consumers of the bucket's stream)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime

from app import errors, validation
from app.direct.service import DirectService
from app.durations import ns_from_time, parse_time, start_time_for_nats
from app.errors import ErrorCode
from app.kv.model import (
    Entry,
    bucket_errors,
    entry_from_delivery,
    entry_from_message,
    filter_subject,
    stream_name,
)
from app.nats.direct import MAX_MULTI_SUBJECTS, DirectGet, too_many_subjects
from app.nats.jsapi import JetStreamApi
from app.nats.scan import ConsumerScan, Delivery

_SCAN_BATCH = 256


async def read_at(
    direct: DirectService,
    bucket: str,
    key_filters: list[str],
    *,
    at_revision: int | None,
    at_time: str | None,
    include_deleted: bool,
    on_mirrored: Callable[[], object] = lambda: None,
) -> tuple[int, list[Entry]]:
    """(revision, entries): the latest entry of each matching key at one bucket revision.

    Keys whose entry at that revision is a delete or purge marker are left out unless
    ``include_deleted``; then they are reported with their operation and no value.

    Only the bucket's own stream answers: a mirror with ``mirror_direct`` may take the
    Direct Get, and it may be behind the revision or keep other limits. Its answer is
    dropped (``on_mirrored`` is called) and the keys are read again by consumers on the
    bucket's stream, up to the same revision. So is every read of a bucket without Direct
    Get, or on a server without multi_last (nats-server 2.10), the revision fixed first
    (:func:`_revision_by_consumer`), as ADR-8 reads without Direct Get.
    """
    subjects = []
    for key_filter in dict.fromkeys(key_filters):
        try:
            validation.kv_key_filter(key_filter)
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(ErrorCode.KV_KEY_INVALID, exc.detail) from None
        subjects.append(filter_subject(bucket, key_filter))
    stream = stream_name(bucket)
    with bucket_errors(bucket):
        try:
            revision, messages = await direct.multi(
                stream, subjects, up_to_seq=at_revision, up_to_time=at_time, page_size=None
            )
        except (errors.DirectNotAllowed, errors.BatchUnsupported):
            revision = await _revision_by_consumer(
                direct.direct, bucket, at_revision, _time(at_time)
            )
            found = await _read_by_consumer(direct.js, bucket, subjects, revision)
        else:
            found = [entry_from_message(bucket, message) for message in messages]
            if any(entry.stream != stream for entry in found):
                on_mirrored()
                found = await _read_by_consumer(direct.js, bucket, subjects, revision)
    entries = []
    for entry in found:
        if entry.operation != "PUT":
            if not include_deleted:
                continue
            entry = dataclasses.replace(entry, value=None)
        entries.append(entry)
    entries.sort(key=lambda e: e.key)
    return revision, entries


def _time(at_time: str | None) -> datetime | None:
    try:
        return parse_time(at_time) if at_time else None
    except ValueError as exc:
        raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, f"at_time: {exc}") from None


async def _revision_by_consumer(
    direct: DirectGet, bucket: str, at_revision: int | None, at_time: datetime | None
) -> int:
    """The revision a read is pinned to, without Direct Get: ``at_revision``, or the bucket's
    last (as the multi read resolves them); for ``at_time``, the one before the first message
    stored at or after it (a consumer that starts there), or the last. The last is read
    first: a message stored later is after it. (A first message from before the time, which
    a server should not start at, means none is as late.)"""
    stream = stream_name(bucket)
    last = await direct.resolve_up_to(stream, at_revision, None)
    if at_time is None:
        return last
    every_key = [filter_subject(bucket, ">")]
    start = start_time_for_nats(at_time)
    async with ConsumerScan(direct.js, stream, every_key, start_time=start) as scan:
        first = await scan.next(1)
    if first and first[0].timestamp_ns >= ns_from_time(at_time):
        return min(first[0].stream_seq - 1, last)
    return last


async def _read_by_consumer(
    js: JetStreamApi, bucket: str, subjects: list[str], revision: int
) -> list[Entry]:
    """The last entry of each key matching ``subjects`` up to ``revision``, from the bucket's
    own stream: one ordered scan of the keys named (which never overlap, as a consumer's
    filters must not), and one of each wildcard filter, which may match no more keys than a
    multi_last request may (413 past it, as there)."""
    if revision == 0:
        return []
    named = [s for s in subjects if not _wildcard(s)]
    scans: list[tuple[list[str], int | None]] = [
        ([s], MAX_MULTI_SUBJECTS) for s in subjects if _wildcard(s)
    ]
    if named:
        scans.append((named, None))
    last: dict[str, Delivery] = {}
    for filters, most in scans:
        matched: set[str] = set()
        async with ConsumerScan(js, stream_name(bucket), filters) as scan:
            while not scan.done:
                batch = await scan.next(_SCAN_BATCH)
                for message in batch:
                    if message.stream_seq > revision:
                        scan.done = True
                        break
                    last[message.subject] = message
                    if most is not None:
                        matched.add(message.subject)
                        if len(matched) > most:
                            raise too_many_subjects()
    ordered = sorted(last.values(), key=lambda m: m.stream_seq)
    return [dataclasses.replace(entry_from_delivery(bucket, m), delta=None) for m in ordered]


def _wildcard(subject: str) -> bool:
    tokens = subject.split(".")
    return "*" in tokens or ">" in tokens
