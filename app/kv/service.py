"""The KV service: entries over JetStream, as ADR-8 (and ADR-48 for TTLs) specify them.

A bucket is the stream ``KV_<bucket>``; a key is the subject ``$KV.<bucket>.<key>``; a
revision is a stream sequence. Reads use Direct Get, and fall back on ``STREAM.MSG.GET`` or an
ephemeral consumer (as ADR-8 does) for buckets made without ``allow_direct`` (nats-py's
default). Writes are plain JetStream publishes with the ADR-8 headers, so every KV client reads
what the gateway writes, and the other way round.

Bucket administration is in :mod:`kv_buckets`, key listings in :mod:`kv_keys`, watches in
:mod:`kv_watch`; names, subjects and the Entry model (shared with multi-key reads) in
:mod:`kv_model`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from app import errors, validation
from app.config import Settings
from app.durations import nats_ttl
from app.errors import ErrorCode
from app.kv import model as kv_model
from app.kv.buckets import Buckets
from app.kv.cache import ReadCaches
from app.kv.keys import list_keys
from app.kv.model import (
    ANY_REVISION,
    PUT,
    Entry,
    Precondition,
    as_bucket_error,
    bucket_errors,
    entry_from_delivery,
    entry_from_message,
    key_subject,
    operation_of,
    stream_name,
)
from app.kv.topology import ReadOnlyBuckets, read_only_error
from app.kv.watch import Watches, WatchOptions, WatchSession
from app.metrics import Metrics
from app.nats.direct import DirectGet, StoredMessage, leader_message
from app.nats.floors import RevisionFloors
from app.nats.jsapi import JetStreamApi
from app.nats.scan import ConsumerScan
from app.publish.service import Outgoing, Publisher

# ADR-8 caps history at 64 per key; a stream changed by hand could hold more.
MAX_HISTORY = 1024
_CREATE_ATTEMPTS = 3

# Conditional writes carry a Nats-Msg-Id of their own: "jsgw-<this process's prefix>-<counter>"
# (short: a bucket's max_value_size counts headers too). With it a refused write is sent again
# to learn whether it was stored (the stream answers a stored copy as a duplicate), see
# Publisher.publish.
_WRITE_ID_PREFIX = "jsgw-" + base64.urlsafe_b64encode(os.urandom(6)).decode() + "-"
_write_ids = itertools.count(1)
# A refusal that the key's state contradicts is tried again after a pause (seconds, doubling
# up to the max), until the request timeout: see KVService._write.
_RECHECK_PAUSE = 0.05
_RECHECK_PAUSE_MAX = 0.5


def _new_write_id() -> str:
    return f"{_WRITE_ID_PREFIX}{next(_write_ids):x}"


def _contradicted(key: str, expected: int, last: StoredMessage | None) -> errors.OutcomeUnknown:
    return errors.OutcomeUnknown(
        detail=f"the write was refused, but key {key!r} is at revision "
        f"{last.seq if last else 0} as the stream leader answers, not past revision {expected} "
        "that the write expected and that the key had: the server that refused it is behind "
        "(as just after a partition). Whether the write is stored is not known: read the key "
        "again."
    )


KeyVisible = Callable[[str], bool]
"""Whether the caller may see a key (auth narrowing of wildcard reads)."""


def _key_not_found(key: str, last: Entry | None = None) -> errors.NotFound:
    if last is None:
        return errors.NotFound(ErrorCode.KV_KEY_NOT_FOUND, f"key {key!r} has no value")
    return errors.NotFound(
        ErrorCode.KV_KEY_NOT_FOUND,
        f"key {key!r} has no value (its last operation is {last.operation})",
        extra={"revision": last.revision, "operation": last.operation},
    )


def ttl_header(value: str) -> str:
    """``?ttl=`` as a ``Nats-TTL`` header value (ADR-43): at least 1 second, or ``never``."""
    try:
        return nats_ttl(value)
    except ValueError as exc:
        raise errors.InvalidInput(ErrorCode.KV_TTL_INVALID, f"ttl: {exc}") from None


class KVService:
    def __init__(
        self,
        js: JetStreamApi,
        direct: DirectGet,
        publisher: Publisher,
        settings: Settings,
        metrics: Metrics,
    ) -> None:
        self.js = js
        self.direct = direct
        self.publisher = publisher
        # Reads of a key's latest value never go behind what this process served or wrote:
        # see get() and app.nats.floors.
        self.floors = RevisionFloors()
        self._stale_reads = metrics.kv_stale_reads
        self._outcome_unknown = metrics.outcome_unknown.labels("kv_write")
        self._retry_after = {"Retry-After": str(settings.retry_after)}
        # Read-only aggregates met (or made) recently: their writes are refused unsent.
        self.read_only = ReadOnlyBuckets()
        self.buckets = Buckets(js, direct, self.read_only)
        self.watches = Watches(
            js,
            limit=settings.kv_max_watches,
            queue_size=settings.sse_queue_size,
            idle_heartbeat=settings.kv_watch_heartbeat,
            retry_after=settings.retry_after,
            ping_interval=settings.sse_heartbeat,
            metrics=metrics,
        )
        self.cache = ReadCaches(
            js, settings.kv_cache, settings.kv_watch_heartbeat, settings.kv_cache_max_bytes
        )
        self.cache.start()

    async def close(self) -> None:
        await self.watches.close()
        await self.cache.close()

    # -- reading entries -------------------------------------------------------------------

    @staticmethod
    @functools.lru_cache(maxsize=8192)  # hot keys are validated once (errors are not cached)
    def _names(bucket: str, key: str, *, writing: bool = False) -> tuple[str, str]:
        validation.bucket_name(bucket)
        validation.kv_key(key, writing=writing)
        return stream_name(bucket), key_subject(bucket, key)

    async def get(
        self, bucket: str, key: str, revision: int | None = None, *, leader: bool = False
    ) -> Entry:
        """The value of a key (latest, or at a revision): a PUT entry, else 404.

        ``leader``: read the latest value from the stream leader (``STREAM.MSG.GET``), never
        from the read cache or a replica's Direct Get, which may lag behind a write just
        acknowledged (read-your-writes).

        A latest-value read never answers older than its key's floor, the highest revision
        this process has served or written for it (app.nats.floors): a cached entry behind it
        is not answered, a Direct Get answer behind it is read again from the stream leader.
        A delete or purge marker counts as much as a value, so a read never answers an older
        value after a newer delete. Reads of a revision are answered as they are (one at or
        below the floor that the answer lacks, as a mirror behind would, is read from the
        leader), and raise the floor (as writes, histories and the revision of a 412 do;
        watches do not: a watch of a large bucket would push every other key out of the
        bounded floors).
        """
        stream, subject = self._names(bucket, key)
        if leader and revision is not None:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID, "consistency=leader reads the latest value only"
            )
        floor = self.floors.revisions.get(subject, 0)
        if revision is None and not leader:
            cached, entry = self.cache.lookup(bucket, key)
            if cached:
                seen = 0 if entry is None else entry.revision
                if seen >= floor:  # else the feed is behind an answer already given: NATS
                    if seen > floor:
                        self.floors.advance(subject, seen)
                    if entry is None:
                        raise _key_not_found(key)
                    if entry.operation != PUT:
                        raise _key_not_found(key, entry)
                    return entry
        delta: int | None
        started = time.monotonic()  # a read asked again answers within one request timeout
        try:
            if leader:
                message, delta = await self._leader_last(stream, subject), 0
                self.floors.settle(subject, floor, 0 if message is None else message.seq)
            elif revision is None:
                message, delta = await self._last(stream, subject), 0
                seen = 0 if message is None else message.seq
                if seen != floor:
                    if seen < floor:
                        with self.js.pool.within(started):
                            message = await self._behind(stream, subject, floor)
                    else:
                        self.floors.advance(subject, seen)
            else:
                with self.js.pool.within(started):
                    message, delta = await self._at(stream, subject, revision)
                    if message is None and revision <= floor:
                        # The key reached this revision, but whoever answered (a mirror
                        # behind, or one keeping fewer revisions or other keys) lacks it: the
                        # leader.
                        self._stale_reads.inc()
                        message, delta = await self._at_by_leader(stream, subject, revision)
                if message is not None and message.seq > floor:
                    self.floors.advance(subject, message.seq)
        except errors.NotFound as exc:  # bucket_errors, inline on the hottest path
            raise as_bucket_error(bucket, exc) from None
        # Never another key's value: the subject must be this key's exactly.
        if message is None or message.subject != subject:
            raise _key_not_found(key)
        entry = entry_from_message(bucket, message, delta=delta)
        if entry.operation != PUT:
            raise _key_not_found(key, entry)
        return entry

    def count_stale_read(self) -> None:
        """Count a read answered by a mirror (or a replica behind) and read again."""
        self._stale_reads.inc()

    async def _behind(self, stream: str, subject: str, floor: int) -> StoredMessage | None:
        """The key's last message from the stream leader, for a Direct Get answered older
        than the key's floor (by a replica catching up, typically a server just restarted).

        Errors are the leader read's (as for ``consistency=leader``): the stale answer is
        never given instead.
        """
        self._stale_reads.inc()
        message = await self._leader_last(stream, subject)
        self.floors.settle(subject, floor, 0 if message is None else message.seq)
        return message

    async def _latest(self, stream: str, subject: str) -> StoredMessage | None:
        """The key's last message as :meth:`get` reads it: never older than its floor."""
        floor = self.floors.revisions.get(subject, 0)
        started = time.monotonic()
        message = await self._last(stream, subject)
        seen = 0 if message is None else message.seq
        if seen < floor:
            with self.js.pool.within(started):
                return await self._behind(stream, subject, floor)
        self.floors.advance(subject, seen)
        return message

    async def _last(self, stream: str, subject: str) -> StoredMessage | None:
        try:
            return await self.direct.last_for(stream, subject)
        except errors.MessageNotFound:
            return None
        except errors.DirectNotAllowed:
            pass
        return await self._msg_get(stream, {"last_by_subj": subject})

    async def _at(
        self, stream: str, subject: str, revision: int
    ) -> tuple[StoredMessage | None, int | None]:
        """The message at ``revision`` if it is on ``subject``, and its delta (how many newer).

        A one-message batch from ``revision`` filtered on the key's subject: the server
        counts what follows on that subject, which is ADR-8's delta. The count is taken from
        the end of the batch, which every release reports alike (nats-server 2.11 counts the
        message itself in each message's own Nats-Num-Pending, 2.12 and later do not).
        """
        request = {"seq": revision, "next_by_subj": subject, "batch": 1}
        found: StoredMessage | None = None
        newer: int | None = None
        try:
            async for item in self.direct.page(stream, request, operation="kv.get"):
                if isinstance(item, StoredMessage):
                    found = item
                else:
                    newer = item.num_pending
        except (errors.DirectNotAllowed, errors.BatchUnsupported):
            return await self._at_by_leader(stream, subject, revision)
        if found is not None and found.stream != stream:
            # A mirror answered: it may keep fewer revisions (or have dropped this one by
            # its own limits), and its delta counts its own. The bucket's stream decides.
            self._stale_reads.inc()
            return await self._at_by_leader(stream, subject, revision)
        if found is None or found.seq != revision:
            return None, None
        return found, newer

    async def _at_by_leader(
        self, stream: str, subject: str, revision: int
    ) -> tuple[StoredMessage | None, int | None]:
        """:meth:`_at` from the stream leader: the message at the revision, and the newer
        revisions counted by a consumer that starts after it (its num_pending), as ADR-8
        reads without Direct Get (or without its batches: nats-server 2.10)."""
        found = await self._msg_get(stream, {"seq": revision})
        if found is None or found.subject != subject:
            return None, None
        async with ConsumerScan(self.js, stream, [subject], start_seq=revision + 1) as after:
            return found, after.pending

    async def _msg_get(
        self, stream: str, request: dict[str, Any], timeout: float | None = None
    ) -> StoredMessage | None:
        """``STREAM.MSG.GET``, for buckets without Direct Get (ADR-8 "allow_direct is false"),
        and reads of the stream leader."""
        return await leader_message(self.js, stream, request, operation="kv.get", timeout=timeout)

    async def history(self, bucket: str, key: str) -> list[Entry]:
        """Every stored revision of a key, oldest first, deletes included."""
        stream, subject = self._names(bucket, key)
        floor = self.floors.revisions.get(subject, 0)
        started = time.monotonic()
        with bucket_errors(bucket):
            try:
                entries = await self._history_by_direct(bucket, stream, subject)
            except (errors.DirectNotAllowed, errors.BatchUnsupported):
                # ADR-8's way, which every server with KV has: an ordered consumer.
                entries = await self._history_by_consumer(bucket, stream, subject)
            else:
                mirrored = any(entry.stream != stream for entry in entries)
                if mirrored or (entries[-1].revision if entries else 0) < floor:
                    # Answered by a mirror (which keeps its own history, maybe shorter), or
                    # by one behind what this process served or wrote: the bucket's own
                    # stream, by a consumer.
                    self._stale_reads.inc()
                    with self.js.pool.within(started):
                        entries = await self._history_by_consumer(bucket, stream, subject)
        if not entries:
            raise _key_not_found(key)
        self.floors.advance(subject, entries[-1].revision)
        return entries

    async def _history_by_direct(self, bucket: str, stream: str, subject: str) -> list[Entry]:
        """The revisions by batched Direct Get. Each one's delta counts the revisions read
        after it plus what the end of the batch says is left, which every release reports
        alike (a message's own Nats-Num-Pending counts itself on nats-server 2.11)."""
        messages: list[StoredMessage] = []
        left = 0
        async for item in self.direct.batch(stream, seq=1, next_by_subj=subject, limit=MAX_HISTORY):
            if isinstance(item, list):
                messages.extend(item)
            else:
                left = item.num_pending
        last = len(messages) - 1
        return [
            entry_from_message(bucket, message, delta=left + last - index)
            for index, message in enumerate(messages)
        ]

    async def _history_by_consumer(self, bucket: str, stream: str, subject: str) -> list[Entry]:
        entries: list[Entry] = []
        async with ConsumerScan(self.js, stream, [subject]) as scan:
            while not scan.done and len(entries) < MAX_HISTORY:
                for message in await scan.next(min(256, MAX_HISTORY - len(entries))):
                    entries.append(entry_from_delivery(bucket, message, meta_only=False))
        return entries

    async def keys(
        self,
        bucket: str,
        key_filter: str | None,
        *,
        limit: int,
        cursor: str | None,
        visible: KeyVisible | None = None,
    ) -> tuple[list[str], str | None]:
        """One page of the keys with a value (deletes and purges left out); see kv_keys."""
        validation.bucket_name(bucket)
        key_filter = ">" if key_filter is None else validation.kv_key_filter(key_filter)
        with bucket_errors(bucket):
            info = await self.js.call("stream.info", "STREAM", "INFO", stream_name(bucket))
            return await list_keys(self.js, bucket, info, key_filter, limit, cursor, visible)

    # -- writing entries -------------------------------------------------------------------

    async def put(
        self,
        bucket: str,
        key: str,
        value: bytes,
        precondition: Precondition,
        ttl: str | None = None,
    ) -> tuple[int, bool]:
        """Store a value; returns (revision, created). ``ttl`` only when creating (ADR-48)."""
        stream, subject = self._names(bucket, key, writing=True)
        headers: dict[str, str] = {}
        if ttl is not None:
            if not precondition.create:
                raise errors.InvalidInput(
                    ErrorCode.KV_TTL_NOT_ALLOWED,
                    "a per-key ttl is set when creating a key (If-None-Match: *) or purging it; "
                    "on a plain put an older revision could outlive it (ADR-48)",
                )
            headers[kv_model.TTL_HEADER] = ttl_header(ttl)
        self._check_writable(bucket)
        with bucket_errors(bucket):
            try:
                if precondition.create:
                    revision = await self._create(stream, subject, key, value, headers)
                else:
                    expected = await self._expected(stream, subject, key, precondition)
                    revision = await self._write(stream, subject, key, value, headers, expected)
            except errors.StreamNoMatch:
                raise await self._unwritable(bucket, stream) from None
        self.cache.written(bucket, key, revision)
        self.floors.advance(subject, revision)
        return revision, precondition.create

    async def delete(
        self,
        bucket: str,
        key: str,
        *,
        purge: bool,
        precondition: Precondition,
        ttl: str | None = None,
    ) -> int:
        """Write a DEL marker (history kept) or a PURGE marker (``Nats-Rollup: sub``)."""
        stream, subject = self._names(bucket, key, writing=True)
        if precondition.create:
            raise errors.InvalidInput(
                ErrorCode.KV_PRECONDITION_INVALID, "If-None-Match does not apply to a delete"
            )
        if purge:
            headers = {kv_model.OPERATION_HEADER: kv_model.PURGE, kv_model.ROLLUP_HEADER: "sub"}
        else:
            headers = {kv_model.OPERATION_HEADER: kv_model.DEL}
        if ttl is not None:
            if not purge:
                raise errors.InvalidInput(
                    ErrorCode.KV_TTL_NOT_ALLOWED, "a ttl applies to a purge marker only (ADR-48)"
                )
            headers[kv_model.TTL_HEADER] = ttl_header(ttl)
        self._check_writable(bucket)
        with bucket_errors(bucket):
            try:
                expected = await self._expected(stream, subject, key, precondition)
                revision = await self._write(stream, subject, key, b"", headers, expected)
            except errors.StreamNoMatch:
                raise await self._unwritable(bucket, stream) from None
        self.cache.written(bucket, key, revision)
        self.floors.advance(subject, revision)
        return revision

    def _check_writable(self, bucket: str) -> None:
        """A bucket known to be a read-only aggregate: 409 before anything is sent."""
        if bucket in self.read_only:
            raise read_only_error(bucket)

    async def _unwritable(self, bucket: str, stream: str) -> errors.GatewayError:
        """No stream took a write to the bucket: a read-only aggregate (it has no subjects),
        or no bucket at all. Nothing was stored either way."""
        try:
            info = await self.js.call("stream.info", "STREAM", "INFO", stream)
        except errors.StreamNotFound as exc:
            return exc
        read_only = kv_model.is_read_only(info.get("config") or {})
        self.read_only.mark(bucket, read_only)
        if read_only:
            return read_only_error(bucket)
        return errors.StreamNoMatch(detail=f"no stream captures the keys of bucket {bucket!r}")

    async def _expected(
        self, stream: str, subject: str, key: str, precondition: Precondition
    ) -> int | None:
        """The revision a write must find, from If-Match (``*``: whatever value is there)."""
        if precondition.revision != ANY_REVISION:
            return precondition.revision
        last = await self._latest(stream, subject)
        if last is None or operation_of(last.headers) != PUT:
            raise self._mismatch(key, last)
        return last.seq

    async def _create(
        self, stream: str, subject: str, key: str, value: bytes, headers: dict[str, str]
    ) -> int:
        """ADR-8 Create: expect no message on the key, or else a delete/purge as its last."""
        expected = 0
        for _ in range(_CREATE_ATTEMPTS):
            try:
                expect = {kv_model.EXPECTED_HEADER: str(expected)}
                return await self._publish(subject, value, {**headers, **expect})
            except errors.PreconditionFailed:
                last = await self._leader_last(stream, subject)
                if last is not None and operation_of(last.headers) == PUT:
                    raise errors.PreconditionFailed(
                        ErrorCode.KV_KEY_EXISTS,
                        f"key {key!r} already has a value (revision {last.seq})",
                        extra={"revision": last.seq},
                    ) from None
                expected = last.seq if last is not None else 0
        raise self._mismatch(key, await self._leader_last(stream, subject))

    async def _write(
        self,
        stream: str,
        subject: str,
        key: str,
        value: bytes,
        headers: dict[str, str],
        expected: int | None,
    ) -> int:
        """Store a value, if the key is at ``expected`` (a revision) when given.

        A refusal is answered 412 only when it is known to hold. A server behind the others
        holds a prefix of the stream's history, never a revision the others lack, so a key
        that the stream leader finds past ``expected`` can never be at ``expected`` again:
        the refusal holds, whoever made it, as it does when ``expected`` is another key's
        revision, unless the message the leader finds is this very write (its Nats-Msg-Id):
        a deposed leader refused it while the new leader stored it, and it is answered as
        stored. A key found at or before ``expected`` contradicts the refusal (or the server
        answering is behind the revision the client read: a deposed leader after a partition
        answers both the write and the read from its stale state, and the new leader may
        store the write later still). Then the write is sent again with its Nats-Msg-Id (a
        stored copy is answered as a duplicate) after a short pause, until the request
        timeout: 504 outcome unknown if it is still contradicted then, 412 if the revision
        expected is in no answer (none of the key's, as far as anyone knows).
        """
        if expected is None:
            return await self._publish(subject, value, headers)
        headers = {**headers, kv_model.EXPECTED_HEADER: str(expected)}
        msg_id = _new_write_id()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publisher.pool.timeout
        pause = _RECHECK_PAUSE
        while True:
            try:
                return await self._publish(
                    subject, value, headers, msg_id, timeout=max(0.01, deadline - loop.time())
                )
            except errors.PreconditionFailed:
                try:
                    left = max(0.01, deadline - loop.time())
                    last = await self._leader_last(stream, subject, timeout=left)
                    if last is not None and msg_id in last.headers.get("Nats-Msg-Id", ()):
                        return last.seq  # refused by a deposed leader, stored by the new one
                    if last is not None and last.seq > expected:
                        raise self._mismatch(key, last) from None
                    left = max(0.01, deadline - loop.time())
                    at = await self._msg_get(stream, {"seq": expected}, timeout=left)
                except errors.Timeout:  # the refusal cannot be confirmed in time
                    raise self._unknown(
                        errors.OutcomeUnknown(
                            detail="the write was refused, and the stream leader did not answer "
                            "in time to confirm it: whether it is stored is not known; read the "
                            "key again"
                        )
                    ) from None
                if at is not None and at.subject != subject:
                    raise self._mismatch(key, last) from None
                if loop.time() + pause >= deadline:
                    if at is None:  # no such revision, as far as any answer shows
                        raise self._mismatch(key, last) from None
                    raise self._unknown(_contradicted(key, expected, last)) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RECHECK_PAUSE_MAX)

    def _unknown(self, error: errors.OutcomeUnknown) -> errors.OutcomeUnknown:
        """Counted as a KV write of unknown outcome (the publisher counts its own)."""
        self._outcome_unknown.inc()
        return error

    async def _leader_last(
        self, stream: str, subject: str, timeout: float | None = None
    ) -> StoredMessage | None:
        """The key's last message as the stream leader has it, for the revision a 412 reports
        (a replica's Direct Get may lag behind the write that made the precondition fail).
        It raises the key's floor: a 412 tells the client that revision.

        A stream without a leader (being elected) is answered ``10008 JetStream cluster not
        available``: a 503 to retry, with Retry-After as the gateway's other 503s.
        """
        try:
            message = await self._msg_get(stream, {"last_by_subj": subject}, timeout)
        except errors.Unavailable as exc:
            exc.headers = {**self._retry_after, **exc.headers}
            raise
        if message is not None and message.subject == subject:
            self.floors.advance(subject, message.seq)
        return message

    async def _publish(
        self,
        subject: str,
        value: bytes,
        headers: dict[str, str],
        msg_id: str | None = None,
        *,
        timeout: float | None = None,
    ) -> int:
        """Publish and return the revision; JetStream's refusals as KV errors.

        A conditional write gets a Nats-Msg-Id of the gateway's (``msg_id``; a new one when
        None), so that a refusal can be confirmed; when only that header makes it too large
        for the bucket, it goes without.
        """
        pool = self.publisher.pool
        message = Outgoing(subject, value, headers)
        if message.size > pool.max_payload:
            raise _too_large(
                f"the value is over the server's max_payload of {pool.max_payload} bytes"
            )
        try:
            if kv_model.EXPECTED_HEADER in headers:
                stamped = {**headers, "Nats-Msg-Id": msg_id or _new_write_id()}
                try:
                    ack = await self.publisher.publish(
                        Outgoing(subject, value, stamped), timeout=timeout, operation="kv_write"
                    )
                except errors.PayloadTooLarge:
                    ack = await self.publisher.publish(
                        message, timeout=timeout, operation="kv_write"
                    )
            else:
                ack = await self.publisher.publish(message, timeout=timeout, operation="kv_write")
        except errors.PayloadTooLarge as exc:
            # (The server counts a message's headers in it: a marker, a value by a hair under
            # the bound, can be refused for the headers a delete or a condition adds.)
            head = message.size - len(value) if message.headers else 0
            detail = (
                f"the value ({len(value)} bytes) and the headers the write carries ({head} "
                f"bytes; the server counts them too) are over the bucket's max_value_size "
                f"({exc.detail})"
            )
            raise _too_large(detail) from None
        except errors.TtlDisabled as exc:
            raise errors.Conflict(
                ErrorCode.KV_TTL_DISABLED,
                "this bucket takes no per-key ttl: set limit_marker_ttl on it first (ADR-48)",
                nats=exc.nats,
            ) from None
        return int(ack["seq"])

    @staticmethod
    def _mismatch(key: str, last: StoredMessage | None) -> errors.PreconditionFailed:
        revision = last.seq if last is not None else 0
        extra: dict[str, Any] = {"revision": revision}
        if last is not None:
            extra["operation"] = operation_of(last.headers)
        return errors.PreconditionFailed(
            ErrorCode.KV_REVISION_MISMATCH,
            f"key {key!r} is at revision {revision}, not the one the write expected",
            extra=extra,
        )

    # -- watching --------------------------------------------------------------------------

    async def watch(
        self, bucket: str, options: WatchOptions, visible: KeyVisible | None = None
    ) -> WatchSession:
        validation.bucket_name(bucket)
        with bucket_errors(bucket):
            return await self.watches.open(bucket, options, visible)


def _too_large(detail: str) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(ErrorCode.KV_VALUE_TOO_LARGE, detail)
