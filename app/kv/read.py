"""Consistent multi-key reads of a bucket: every entry as of one revision (ADR-31 multi_last)."""

from __future__ import annotations

import dataclasses

from app import errors, validation
from app.direct.service import DirectService
from app.errors import ErrorCode
from app.kv.model import (
    Entry,
    bucket_errors,
    entry_from_message,
    filter_subject,
    stream_name,
)


async def read_at(
    direct: DirectService,
    bucket: str,
    key_filters: list[str],
    *,
    at_revision: int | None,
    at_time: str | None,
    include_deleted: bool,
) -> tuple[int, list[Entry]]:
    """(revision, entries): the latest entry of each matching key at one bucket revision.

    Keys whose entry at that revision is a delete or purge marker are left out unless
    ``include_deleted``; then they are reported with their operation and no value.
    """
    subjects = []
    for key_filter in dict.fromkeys(key_filters):
        try:
            validation.kv_key_filter(key_filter)
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(ErrorCode.KV_KEY_INVALID, exc.detail) from None
        subjects.append(filter_subject(bucket, key_filter))
    with bucket_errors(bucket):
        revision, messages = await direct.multi(
            stream_name(bucket), subjects, up_to_seq=at_revision, up_to_time=at_time, page_size=None
        )
    entries = []
    for message in messages:
        entry = entry_from_message(bucket, message)
        if entry.operation != "PUT":
            if not include_deleted:
                continue
            entry = dataclasses.replace(entry, value=None)
        entries.append(entry)
    entries.sort(key=lambda e: e.key)
    return revision, entries
