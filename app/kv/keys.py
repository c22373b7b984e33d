"""Listing a bucket's keys a page at a time, whatever the size of the bucket.

ADR-8 lists keys with one headers-only consumer delivering the last message of every subject.
That consumer cannot start in the middle (the server refuses ``last_per_subject`` with a start
sequence), so paging with it would re-read every earlier key on every page. A page here is a
forward scan instead:

1. a headers-only pull consumer on the key filter, from the cursor (a stream sequence), is
   read until the page holds ``limit`` keys whose latest message seen is a PUT;
2. when the bucket keeps history, a key may have a newer message further on: a second
   headers-only consumer, ``last_per_subject`` on just the page's keys (``filter_subjects``),
   keeps the keys whose latest message is the one seen. With history 1 every stored message
   is its key's latest (the server drops the older one on write) and this step is skipped.

A page costs O(limit) messages at any depth; the cursor is the stream sequence of the last
message examined. As with Redis' SCAN, a key written during the listing may show up twice or
be missed; a key that holds a value for the whole listing shows up at least once. Keys come in
the order of their last revision, not sorted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app import errors
from app.errors import ErrorCode
from app.kv.model import (
    PUT,
    filter_subject,
    key_of,
    operation_of,
    stream_name,
)
from app.nats.jsapi import JetStreamApi
from app.nats.scan import ConsumerScan
from app.validation import REVISION_DIGITS

_BATCH = 1000
_MIN_BATCH = 256
# Messages examined per key asked for before a page is returned short (a bucket full of
# delete markers must not make one request scan all of it).
_SCAN_FACTOR = 10
_MIN_BUDGET = 10_000
_LATEST_CHUNK = 1000


def parse_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    if len(cursor) > REVISION_DIGITS or not cursor.isascii() or not cursor.isdigit():
        raise errors.InvalidInput(
            ErrorCode.KV_CURSOR_INVALID, "cursor must be a next_cursor returned by this listing"
        )
    return int(cursor)


async def list_keys(
    js: JetStreamApi,
    bucket: str,
    info: dict[str, Any],
    key_filter: str,
    limit: int,
    cursor: str | None,
    visible: Callable[[str], bool] | None,
) -> tuple[list[str], str | None]:
    """One page: (keys, next_cursor); next_cursor is None after the last page."""
    start = parse_cursor(cursor)
    stream = stream_name(bucket)
    seen: dict[str, tuple[int, str]] = {}  # subject -> (seq, operation) of its latest in the page
    live = 0
    last = start
    budget = max(limit * _SCAN_FACTOR, _MIN_BUDGET)
    finished = False
    async with ConsumerScan(
        js, stream, [filter_subject(bucket, key_filter)], start_seq=start + 1, headers_only=True
    ) as scan:
        while live < limit and budget > 0 and not finished:
            batch = await scan.next(min(max(limit - live, _MIN_BATCH), _BATCH, budget))
            budget -= len(batch)
            finished = scan.done
            for index, message in enumerate(batch):
                previous = seen.pop(message.subject, None)
                if previous is not None and previous[1] == PUT:
                    live -= 1
                operation = operation_of(message.headers)
                seen[message.subject] = (message.stream_seq, operation)
                live += operation == PUT
                last = message.stream_seq
                if live == limit:
                    # Stop exactly here: what follows in this batch belongs to the next page.
                    finished = finished and index == len(batch) - 1
                    break
    subjects = [subject for subject, (_, operation) in seen.items() if operation == PUT]
    history = int((info.get("config") or {}).get("max_msgs_per_subject") or 1)
    if history != 1 and subjects:
        latest = await _latest(js, stream, subjects)
        subjects = [s for s in subjects if latest.get(s) == seen[s][0]]
    keys = [key_of(bucket, subject) for subject in subjects]
    if visible is not None:
        keys = [key for key in keys if visible(key)]
    return keys, None if finished else str(last)


async def _latest(js: JetStreamApi, stream: str, subjects: list[str]) -> dict[str, int]:
    """The stream sequence of the latest message of each subject (headers only)."""
    latest: dict[str, int] = {}
    for at in range(0, len(subjects), _LATEST_CHUNK):
        chunk = subjects[at : at + _LATEST_CHUNK]
        scan = ConsumerScan(js, stream, chunk, last_per_subject=True, headers_only=True)
        async with scan:
            while not scan.done:
                for message in await scan.next(_BATCH):
                    latest[message.subject] = message.stream_seq
    return latest
