"""Object buckets (ADR-20): buckets, streamed uploads and downloads, links, deletes, listings.

Uploads are streamed: the body is cut into chunks of :data:`CHUNK_SIZE` as it arrives and each
chunk is published (a few at a time, on one connection so that they stay in order) while the
next one is read; the digest is computed on the way. Nothing of the upload is visible until
its meta message is stored, and anything that stops an upload before that (the client gone,
a refused precondition, an error from NATS) purges the new version's chunk subject, so no
orphaned chunks stay. Once the meta message is stored, the previous version's chunks are
purged (as nats-py does). A meta message whose PubAck never came may be stored: nothing is
purged until the write is settled in the background (:meth:`ObjService._settle`), so an info
is never left without its chunks.

Every write (an upload, conditional or not, a delete) stores its meta message only in place
of the version it read (``Nats-Expected-Last-Subject-Sequence``), and then purges that
version's chunks and no other's. Refused because that version was not the last (read from a
replica behind another client's write, or another writer came in between), it reads the
version the stream leader has and tries again (:meth:`ObjService._replace`): two uploads of
one name without a condition both succeed, the later meta message winning, and neither
leaves the other's chunks behind. ``If-Match`` / ``If-None-Match`` uploads are checked again
against that version: when it no longer meets them, nothing of the upload stays.

Downloads read the chunks with batched Direct Gets (ADR-31) of a few chunks at a time, the
next batch asked for while the current one is handed on: memory per download is two batches
(on nats-server 2.10, which has no batches, a batch is read by a Direct Get per chunk).
A range starts at the chunk that holds its first byte when the object's chunks can be shown to
be laid out regularly (:func:`_regular`); otherwise the chunks before it are read and skipped.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.nuid import NUID

from app import errors
from app.durations import time_from_ns
from app.errors import ErrorCode
from app.nats.direct import DirectGet, StoredMessage, leader_message
from app.nats.floors import RevisionFloors
from app.nats.jsapi import JetStreamApi, parse_response
from app.nats.replies import Reply
from app.nats.scan import ConsumerScan
from app.obj import model
from app.obj.model import CHUNK_SIZE, ObjectInfo
from app.obj.schemas import ObjConfig
from app.obj.watch import watch_events
from app.streams.service import create_or_update, every_stream
from app.tasks import run_to_end

log = logging.getLogger("jsgw.obj")

PUBLISH_WINDOW = 4  # chunks published and not yet acknowledged, per upload
READ_BATCH = 8  # chunks per Direct Get batch of a download
# Attempts at storing an object's new info in place of the version read, each refused
# because that version was not the last (read from a lagging replica, or replaced meanwhile).
_REPLACE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Precondition:
    """An upload's condition: ``create`` (If-None-Match: *) or ``digest`` (If-Match)."""

    create: bool = False
    digest: str | None = None

    @property
    def given(self) -> bool:
        return self.create or self.digest is not None


@dataclass(slots=True)
class Upload:
    """What an upload says about the object besides its content."""

    description: str | None = None
    headers: dict[str, list[str]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes ``start`` to ``end`` (inclusive) of an object."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def _bucket_missing(bucket: str) -> errors.NotFound:
    return errors.NotFound(
        ErrorCode.OBJ_BUCKET_NOT_FOUND, f"object bucket {bucket!r} does not exist"
    )


def _object_missing(bucket: str, name: str) -> errors.NotFound:
    return errors.NotFound(ErrorCode.OBJ_NOT_FOUND, f"bucket {bucket!r} has no object {name!r}")


@contextlib.contextmanager
def _bucket_errors(bucket: str) -> Any:
    try:
        yield
    except (errors.StreamNotFound, errors.StreamNoMatch):
        raise _bucket_missing(bucket) from None


# An info (or delete marker) whose PubAck never came is sent again this many request timeouts
# after the write gave up, then after twice that, ... (:meth:`ObjService._settle`).
_SETTLE_PAUSES = (1, 2, 4)


class _InfoUnknown(Exception):
    """An object's info (or delete marker) was sent and its PubAck did not come (504, or the
    write was cancelled): it may be stored. What was sent, to send it again."""

    def __init__(
        self,
        error: BaseException,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        replaced: ObjectInfo | None,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.subject = subject
        self.data = data
        self.headers = headers
        self.replaced = replaced  # the version it was to replace


def _with_chunks(info: ObjectInfo | None) -> str | None:
    """The nuid of a version that has chunks (not deleted, not a link), else None."""
    if info is None or info.deleted or not info.nuid or info.link is not None:
        return None
    return info.nuid


class ObjService:
    def __init__(self, js: JetStreamApi, direct: DirectGet, chunk_size: int = CHUNK_SIZE) -> None:
        self.js = js
        self.direct = direct
        self.chunk_size = chunk_size
        self._nuid = NUID()
        # Each object's meta subject -> the last sequence this process wrote or served for it
        # (read-your-writes: see current() and app.nats.floors).
        self.floors = RevisionFloors()

    # -- buckets ---------------------------------------------------------------------------

    async def list_buckets(self, visible: Callable[[str], bool]) -> list[dict[str, Any]]:
        out = []
        async for info in every_stream(self.js):
            config = info.get("config") or {}
            bucket = model.bucket_of_stream(str(config.get("name", "")))
            if bucket and model.is_bucket(bucket, config) and visible(bucket):
                out.append(_status(bucket, info))
        return out

    async def _stream_info(self, bucket: str) -> dict[str, Any]:
        model.bucket_name(bucket)
        with _bucket_errors(bucket):
            info = await self.js.call("stream.info", "STREAM", "INFO", model.stream_name(bucket))
        if not model.is_bucket(bucket, info.get("config") or {}):
            raise _not_a_bucket(bucket)
        return info

    async def status(self, bucket: str) -> dict[str, Any]:
        return _status(bucket, await self._stream_info(bucket))

    async def put_bucket(self, bucket: str, config: ObjConfig) -> tuple[dict[str, Any], bool]:
        """Create (True) or update (False) a bucket; its stream is always ADR-20's."""
        model.bucket_name(bucket)
        stream = model.stream_name(bucket)
        existing: dict[str, Any] | None = None
        with contextlib.suppress(errors.NotFound):
            existing = (await self.js.call("stream.info", "STREAM", "INFO", stream)).get("config")
        if existing is not None and not model.is_bucket(bucket, existing):
            raise _not_a_bucket(bucket)
        body = model.stream_config(bucket, config.model_dump(exclude_none=True))
        info, created = await create_or_update(
            self.js, self.direct, stream, body, existing=existing
        )
        return _status(bucket, info), created

    async def delete_bucket(self, bucket: str) -> None:
        await self._stream_info(bucket)
        stream = model.stream_name(bucket)
        with _bucket_errors(bucket):
            await self.js.call("stream.delete", "STREAM", "DELETE", stream, write=True)
        self.direct.forget(stream)

    # -- infos -----------------------------------------------------------------------------

    async def current(self, bucket: str, name: str, *, leader: bool = False) -> ObjectInfo | None:
        """The object's latest info (deleted ones included), or None when it has none.
        ``leader``: as the stream leader has it (a write refused for a version read from a
        replica behind another client's write: see :meth:`_replace`)."""
        model.bucket_name(bucket)
        model.object_name(name)
        stream = model.stream_name(bucket)
        subject = model.meta_subject(bucket, name)
        floor = self.floors.revisions.get(subject, 0)
        started = time.monotonic()
        with _bucket_errors(bucket):
            try:
                message: StoredMessage | None = (
                    None if leader else await self.direct.last_for(stream, subject)
                )
            except (errors.StreamNotFound, errors.StreamNoMatch):
                raise
            except errors.NotFound:
                message = None
            seen = 0 if message is None else message.seq
            if leader or seen < floor:
                # A replica behind a write or an answer of this process (a 404 for an object
                # just stored): the stream leader has it, asked in what is left of the time.
                with self.js.pool.within(started):
                    message = await leader_message(
                        self.js, stream, {"last_by_subj": subject}, operation="obj.info"
                    )
                self.floors.settle(subject, floor, 0 if message is None else message.seq)
            elif seen > floor:
                self.floors.advance(subject, seen)
        return None if message is None else _info_of(message)

    async def info(self, bucket: str, name: str) -> ObjectInfo:
        """The object's info (404 when it has none or is deleted)."""
        info = await self.current(bucket, name)
        if info is None or info.deleted:
            raise _object_missing(bucket, name)
        return info

    async def resolve(self, bucket: str, name: str) -> tuple[ObjectInfo, ObjectInfo]:
        """The object's info and that of the object whose content it has: itself, or the
        object its link names (ADR-20: a link is followed once; a link to a link is not)."""
        info = await self.info(bucket, name)
        if info.link is None:
            return info, info
        target_name = info.link.get("name")
        if not target_name:
            raise errors.Conflict(
                ErrorCode.OBJ_LINK_TO_BUCKET,
                f"{name!r} links to the whole bucket {info.link['bucket']!r}",
            )
        try:
            target = await self.info(info.link["bucket"], target_name)
        except errors.InvalidInput:
            raise errors.UpstreamError(
                ErrorCode.OBJ_META_INVALID, f"{name!r} links to an invalid name"
            ) from None
        if target.link is not None:
            raise _object_missing(info.link["bucket"], target_name)
        return info, target

    async def list(self, bucket: str, include_deleted: bool = False) -> list[ObjectInfo]:
        stream = model.stream_name(bucket)
        info = await self._stream_info(bucket)
        up_to = int((info.get("state") or {}).get("last_seq", 0))
        out: list[ObjectInfo] = []
        if up_to == 0:
            return out
        with _bucket_errors(bucket):
            try:
                every = [
                    _info_of(message)
                    async for message in self.direct.multi_last(
                        stream, [model.all_meta(bucket)], up_to
                    )
                ]
            except errors.BatchUnsupported:  # nats-server 2.10: by a consumer, as ADR-8 lists keys
                every = await self._infos_by_consumer(stream, bucket)
        out = [item for item in every if include_deleted or not item.deleted]
        out.sort(key=lambda item: item.name)
        return out

    async def _infos_by_consumer(self, stream: str, bucket: str) -> builtins.list[ObjectInfo]:
        """Every object's latest info, by a consumer of the last meta message of each (as
        ADR-8 lists keys): the infos up to the stream's last sequence read once the consumer
        is made. That sequence is read after the consumer, not before: an info replaced in
        between is then among the consumer's, where before it fell past the bound and left
        its object out. What is written once the bound is read comes after it, and waits
        for the next listing."""
        latest: dict[str, ObjectInfo] = {}
        async with ConsumerScan(
            self.js, stream, [model.all_meta(bucket)], last_per_subject=True
        ) as scan:
            state = (await self._stream_info(bucket)).get("state") or {}
            up_to = int(state.get("last_seq", 0))
            while not scan.done:
                for message in await scan.next(256):
                    if message.stream_seq > up_to:
                        return builtins.list(latest.values())
                    stamp = time_from_ns(message.timestamp_ns)
                    info = model.parse_info(message.data, message.stream_seq, stamp)
                    latest[message.subject] = info
        return builtins.list(latest.values())

    # -- uploads ---------------------------------------------------------------------------

    async def check(self, bucket: str, name: str, condition: Precondition) -> ObjectInfo | None:
        """The object's current info, after checking ``condition`` against it (412). A
        refusal is confirmed against the stream leader before it is believed (a replica
        behind another client's write answers the version before it)."""
        current = await self.current(bucket, name)
        try:
            return _checked(name, condition, current)
        except errors.PreconditionFailed:
            return _checked(name, condition, await self.current(bucket, name, leader=True))

    async def put(
        self,
        bucket: str,
        name: str,
        body: AsyncIterator[bytes],
        upload: Upload,
        condition: Precondition,
        current: ObjectInfo | None,
    ) -> tuple[ObjectInfo, bool]:
        """Store ``body`` as the object's new version (``current``: what :meth:`check`
        found); the previous version's chunks are purged once the new one is stored. The
        info, and whether the object was created (the version replaced, which may be another
        than ``current``, was none or a deletion)."""
        stream = model.stream_name(bucket)
        nuid = self._nuid.next().decode()
        subject = model.chunk_subject(bucket, nuid)
        info = ObjectInfo(
            bucket=bucket,
            name=name,
            nuid=nuid,
            description=upload.description,
            headers=upload.headers,
            metadata=upload.metadata,
            max_chunk_size=self.chunk_size,
        )
        try:
            try:
                size, chunks, digest = await self._write_chunks(subject, body)
            except errors.Unavailable as exc:
                raise await self._why_refused(bucket, exc) from None
            info.size, info.chunks, info.digest = size, chunks, model.digest_of(digest)
            info.mtime = model.now_rfc3339()
            if not condition.given:
                # What this version replaces is what is there now, not what was there when
                # the upload began (another may have been stored meanwhile).
                current = await self.current(bucket, name)

            def meta(replaced: ObjectInfo | None) -> bytes:
                if condition.given:
                    _checked(name, condition, replaced)
                return info.wire()

            ack, current = await self._replace(bucket, name, current, meta)
            info.seq = int(ack.get("seq") or 0)
        except _InfoUnknown as unknown:
            # The info may be stored: this version's chunks stay until that is settled.
            self._settle_later(bucket, name, unknown, own=nuid)
            raise unknown.error from None
        except BaseException:
            with anyio_shield():
                await self._purge_quietly(stream, subject)
            raise
        replaced = _with_chunks(current)
        if replaced is not None and replaced != nuid:
            await self._purge(stream, model.chunk_subject(bucket, replaced))
        return info, current is None or current.deleted

    async def _write_chunks(
        self, subject: str, body: AsyncIterator[bytes]
    ) -> tuple[int, int, bytes]:
        size = self.chunk_size
        pending: deque[asyncio.Task[dict[str, Any]]] = deque()
        buffer = bytearray()
        sha = hashlib.sha256()
        total = chunks = 0
        client = self.js.pool.pick()  # one connection: the chunks stay in order

        async def send(chunk: bytes) -> None:
            nonlocal chunks
            sha.update(chunk)
            if not chunks:
                # Alone, so that it can be sent again if nobody takes it (a new bucket's
                # stream, a leader just elected); once it is stored, the rest follow in a
                # window, in order, and are not sent again: they would land out of order.
                await self._publish(subject, chunk, None, client)
                chunks = 1
                return
            while len(pending) >= PUBLISH_WINDOW:
                await pending.popleft()
            pending.append(
                asyncio.ensure_future(self._publish(subject, chunk, None, client, again=False))
            )
            chunks += 1

        try:
            async for piece in body:
                total += len(piece)
                if not buffer and len(piece) == size:
                    await send(piece)
                    continue
                buffer += piece
                while len(buffer) >= size:
                    chunk = bytes(buffer[:size])
                    del buffer[:size]
                    await send(chunk)
            if buffer:
                await send(bytes(buffer))
                buffer.clear()
            while pending:
                await pending.popleft()
        finally:
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(BaseException):
                    await task
        return total, chunks, sha.digest()

    async def _publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None,
        client: Any = None,
        *,
        again: bool = True,
    ) -> dict[str, Any]:
        """Store one message of the object; sent again when nobody takes it (``again``: none
        is in flight behind it, which it would land after)."""
        pool = self.js.pool

        def send() -> Awaitable[Reply]:
            return pool.request(
                subject, data, operation="obj.put", headers=headers, write=True, client=client
            )

        async def refused() -> errors.GatewayError:
            return errors.StreamUnavailable(
                detail="no stream took a message of the object (its bucket's stream has no "
                "leader right now, e.g. during an election): retry shortly",
                headers={"Retry-After": str(pool.settings.retry_after)},
            )

        started = time.monotonic()
        try:
            reply = await send()
        except errors.NoResponders:
            if not again:
                raise await refused() from None
            reply = await pool.sent_again(send, refused, started)
        return parse_response(reply.data)

    async def _why_refused(self, bucket: str, refusal: errors.Unavailable) -> errors.GatewayError:
        """A chunk refused as unavailable (JetStream's store error, or nobody took it): a full
        bucket when its max_bytes has no room for another chunk, else the refusal as it was."""
        info = await self._stream_info(bucket)
        limit = int((info.get("config") or {}).get("max_bytes") or -1)
        used = int((info.get("state") or {}).get("bytes") or 0)
        if 0 < limit < used + self.chunk_size + 1024:
            return errors.PayloadTooLarge(
                ErrorCode.OBJ_BUCKET_FULL,
                f"the object does not fit in bucket {bucket!r} (max_bytes {limit})",
            )
        return refusal

    async def _purge(self, stream: str, subject: str) -> None:
        await self.js.call(
            "stream.purge", "STREAM", "PURGE", stream, body={"filter": subject}, write=True
        )

    async def _purge_quietly(self, stream: str, subject: str) -> None:
        with contextlib.suppress(errors.GatewayError):
            await self._purge(stream, subject)

    # -- deletes ---------------------------------------------------------------------------

    async def delete(self, bucket: str, name: str) -> None:
        """ADR-20's delete: a meta message marking the object deleted, its chunks purged."""
        stream = model.stream_name(bucket)

        def marker(current: ObjectInfo | None) -> bytes:
            if current is None or current.deleted:
                raise _object_missing(bucket, name)
            return ObjectInfo(
                bucket=bucket,
                name=name,
                nuid=current.nuid,
                deleted=True,
                description=current.description,
                headers=current.headers,
                metadata=current.metadata,
            ).wire()

        try:
            _, deleted = await self._replace(bucket, name, await self.current(bucket, name), marker)
        except _InfoUnknown as unknown:
            # The marker may be stored: the chunks go once it is known to be.
            self._settle_later(bucket, name, unknown, own=None)
            raise unknown.error from None
        chunks = _with_chunks(deleted)
        if chunks is not None:
            await self._purge(stream, model.chunk_subject(bucket, chunks))

    def _settle_later(self, bucket: str, name: str, unknown: _InfoUnknown, own: str | None) -> None:
        """:meth:`_settle` in a task of its own, outside the request and its deadline."""
        run_to_end(self._settle(bucket, name, unknown, own), context=contextvars.Context())

    async def _settle(self, bucket: str, name: str, unknown: _InfoUnknown, own: str | None) -> None:
        """Settle a write whose info's PubAck never came, then purge the chunks it leaves
        unused: ``own`` (the nuid of the write's chunks; None for a delete's marker) and
        those of the version it was to replace, each unless the latest info names it.

        A while later the info is sent again as it was (its ``Nats-Msg-Id``, the same expected
        last sequence), which decides the write if nothing else has: stored then, or refused
        because something is stored after the replaced version (the first copy may be among
        it: the server checks the sequence before the duplicate). Then the stream leader's
        latest info says which versions are in use. While it is not past the replaced
        version, the first copy may yet be stored: nothing is purged, and the next attempt
        waits longer; after the last, nothing is purged (chunks left unused, never an info left
        without its chunks). An upload whose chunks are gone meanwhile (its bucket purged)
        is not sent again: its info would name nothing.
        """
        stream = model.stream_name(bucket)
        replaced = unknown.replaced
        try:
            for pause in _SETTLE_PAUSES:
                await asyncio.sleep(pause * self.js.pool.timeout)
                try:
                    if own is None or await self._has_chunks(stream, bucket, own):
                        with contextlib.suppress(errors.PreconditionFailed):
                            await self._publish(unknown.subject, unknown.data, unknown.headers)
                    latest = await self.current(bucket, name, leader=True)
                except errors.GatewayError as exc:
                    log.info("object %s/%s: its write is not settled yet (%s)", bucket, name, exc)
                    continue
                if (latest.seq if latest else 0) <= (replaced.seq if replaced else 0):
                    # Undecided: the first copy may still be stored (or whoever answered,
                    # a deposed leader, is behind the version replaced).
                    continue
                used = _with_chunks(latest)
                for version in {own, _with_chunks(replaced)}:
                    if version is not None and version != used:
                        await self._purge(stream, model.chunk_subject(bucket, version))
                return
        except errors.GatewayError as exc:
            log.warning("object %s/%s: chunks its write left unused stay (%s)", bucket, name, exc)
            return
        except asyncio.CancelledError:
            log.warning("object %s/%s: its write was left unsettled (shutdown)", bucket, name)
            raise
        log.warning(
            "object %s/%s: whether its last write is stored is not known; its chunks are left",
            bucket,
            name,
        )

    async def _has_chunks(self, stream: str, bucket: str, nuid: str) -> bool:
        """Whether the stream leader still has a chunk of the version ``nuid``."""
        found = await leader_message(
            self.js,
            stream,
            {"last_by_subj": model.chunk_subject(bucket, nuid)},
            operation="obj.get",
        )
        return found is not None

    async def _replace(
        self,
        bucket: str,
        name: str,
        current: ObjectInfo | None,
        meta: Callable[[ObjectInfo | None], bytes],
    ) -> tuple[dict[str, Any], ObjectInfo | None]:
        """Store ``meta(current)`` as the object's info in place of ``current`` and of no
        other version: the PubAck, and the version replaced. ``meta`` raises when the version
        may not be replaced (412, 404).

        Refused because ``current`` is not the last version (a replica behind another
        client's write answered it, or a writer came in between), the version the stream
        leader has is replaced instead; 412 ``obj.changed`` after a few attempts.
        """
        subject = model.meta_subject(bucket, name)
        # One id for every attempt, and for the copy :meth:`_settle` may send: the stream
        # stores one of them at most (within its duplicate window).
        write_id = f"jsgw-{self._nuid.next().decode()}"
        for _ in range(_REPLACE_ATTEMPTS):
            data = meta(current)  # (its own 412 or 404 is the answer, not a refusal)
            headers = {
                **model.ROLLUP,
                "Nats-Expected-Last-Subject-Sequence": str(current.seq if current else 0),
                "Nats-Msg-Id": write_id,
            }
            try:
                ack = await self._publish(subject, data, headers)
            except errors.PreconditionFailed:  # wrong last sequence: not the last version
                current = await self.current(bucket, name, leader=True)
                continue
            except (errors.OutcomeUnknown, asyncio.CancelledError) as exc:
                raise _InfoUnknown(exc, subject, data, headers, current) from None
            self.floors.advance(subject, int(ack.get("seq") or 0))
            return ack, current
        raise errors.PreconditionFailed(
            ErrorCode.OBJ_CHANGED, f"object {name!r} changed during the write"
        )

    # -- watches ---------------------------------------------------------------------------

    def watch(
        self,
        bucket: str,
        *,
        since: int | None,
        updates_only: bool,
        visible: Callable[[str], bool],
    ) -> AsyncIterator[dict[str, Any]]:
        """The bucket's object infos as events (:mod:`app.obj.watch`)."""
        return watch_events(
            self.js, bucket, since=since, updates_only=updates_only, visible=visible
        )

    # -- downloads -------------------------------------------------------------------------

    async def read(self, info: ObjectInfo, span: Span | None) -> AsyncIterator[bytes]:
        """The object's content (``span``: only those bytes). A whole read checks the size and
        the digest and raises :data:`ErrorCode.OBJ_CORRUPT` *before* handing on the last
        chunk when they do not match, so that corrupt content is never served whole."""
        if info.size == 0:
            return
        stream = model.stream_name(info.bucket)
        subject = model.chunk_subject(info.bucket, info.nuid)
        whole = span is None or (span.start == 0 and span.end == info.size - 1)
        start_seq, skip, limit, contiguous = 1, 0, info.chunks, False
        if span is not None and not whole:
            start_seq, skip, size = await self._locate(stream, subject, info, span.start)
            if size is not None:  # only the chunks that hold the span
                limit, contiguous = span.end // size - span.start // size + 1, True
        wanted = span.length if span is not None else info.size
        sha = hashlib.sha256() if whole else None
        seen = 0
        chunks = self._chunks(stream, subject, start_seq, limit, contiguous)
        async with contextlib.aclosing(chunks):  # closed at once when the read ends early
            async for data in chunks:
                seen += len(data)
                if sha is not None:
                    sha.update(data)
                    if seen >= info.size:
                        _verify(info, seen, sha.digest())
                if skip:
                    if skip >= len(data):
                        skip -= len(data)
                        continue
                    data, skip = data[skip:], 0
                piece = data[:wanted]
                wanted -= len(piece)
                yield piece
                if wanted <= 0:
                    return
        if sha is not None or wanted > 0:
            raise errors.UpstreamError(
                ErrorCode.OBJ_CORRUPT,
                f"object {info.name!r} has fewer bytes in its chunks than its size {info.size}",
            )

    async def _chunks(
        self, stream: str, subject: str, seq: int, limit: int, contiguous: bool = False
    ) -> AsyncGenerator[bytes, None]:
        """The chunk subject's messages from ``seq`` on (at most ``limit``), a batch ahead.
        ``contiguous``: they must be at ``seq``, ``seq + 1``, ... (a gap is a lost chunk).

        Direct Gets that come up short were answered by a server behind the object's write
        (an object just stored), or a chunk is lost. The stream leader has every chunk of a
        stored object: the next one is asked of it, and the rest by Direct Get again. One the
        leader lacks too is lost: the chunks end there.
        """
        sent = 0
        following = seq
        while sent < limit:
            batches = self._direct_chunks(stream, subject, following, limit - sent)
            async with contextlib.aclosing(batches):
                async for message in batches:
                    yield _chunk_data(message, seq + sent if contiguous else None)
                    sent += 1
                    following = message.seq + 1
            if sent == limit:
                return
            request = {"seq": following, "next_by_subj": subject}
            found = await leader_message(self.js, stream, request, operation="obj.get")
            if found is None:
                return
            yield _chunk_data(found, seq + sent if contiguous else None)
            sent += 1
            following = found.seq + 1

    async def _direct_chunks(
        self, stream: str, subject: str, seq: int, limit: int
    ) -> AsyncGenerator[StoredMessage, None]:
        """Up to ``limit`` of the chunk subject's messages from ``seq`` on, by Direct Get
        batches, the next batch asked for while one is handed on; ends at a short batch."""

        async def batch(start: int, count: int) -> list[StoredMessage]:
            found: list[StoredMessage] = []
            try:
                async for page in self.direct.batch(
                    stream, seq=start, next_by_subj=subject, limit=count
                ):
                    if isinstance(page, list):
                        found.extend(page)
            except errors.BatchUnsupported:  # nats-server 2.10: a Direct Get per chunk
                following = found[-1].seq + 1 if found else start
                found += await self._one_by_one(stream, subject, following, count - len(found))
            return found

        asked = min(READ_BATCH, limit)
        ahead: asyncio.Task[list[StoredMessage]] | None = asyncio.ensure_future(batch(seq, asked))
        try:
            while ahead is not None:
                messages = await ahead
                ahead = None
                if messages and asked < limit and len(messages) == min(READ_BATCH, limit):
                    count = min(READ_BATCH, limit - asked)
                    ahead = asyncio.ensure_future(batch(messages[-1].seq + 1, count))
                    asked += count
                for message in messages:
                    yield message
                del messages
        finally:
            if ahead is not None:
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    await ahead

    async def _one_by_one(
        self, stream: str, subject: str, seq: int, count: int
    ) -> builtins.list[StoredMessage]:
        """Up to ``count`` of the chunk subject's messages from ``seq`` on, one Direct Get
        each (a server without batched Direct Get); fewer when the subject has no more."""
        found: builtins.list[StoredMessage] = []
        while len(found) < count:
            try:
                message = await self.direct.get(stream, {"seq": seq, "next_by_subj": subject})
            except errors.MessageNotFound:
                break
            found.append(message)
            seq = message.seq + 1
        return found

    async def _chunk(self, stream: str, request: dict[str, Any]) -> StoredMessage:
        """One chunk by Direct Get, or from the stream leader when the server that answered
        lacks it (one behind the object's write: an object just stored)."""
        try:
            return await self.direct.get(stream, request)
        except errors.MessageNotFound:
            found = await leader_message(self.js, stream, request, operation="obj.get")
            if found is None:
                raise
            return found

    async def _locate(
        self, stream: str, subject: str, info: ObjectInfo, offset: int
    ) -> tuple[int, int, int | None]:
        """Where a read from byte ``offset`` starts: a stream sequence, the bytes to skip
        from there, and the chunk size when the chunks are laid out regularly (chunk ``k`` at
        the first one's sequence + ``k``); None: read from the first chunk and skip."""
        with _bucket_errors(info.bucket):
            first = await self._chunk(stream, {"seq": 1, "next_by_subj": subject})
            if info.chunks < 2:
                last = first
            else:
                last = await self._chunk(stream, {"last_by_subj": subject})
        size = _regular(info, first, last)
        if size is None:
            return first.seq, offset, None
        index = offset // size
        return first.seq + index, offset - index * size, size


def _checked(name: str, condition: Precondition, current: ObjectInfo | None) -> ObjectInfo | None:
    """``current``, when ``condition`` holds for it; 412 otherwise."""
    live = current is not None and not current.deleted
    if condition.create and live:
        raise errors.PreconditionFailed(
            ErrorCode.OBJ_EXISTS, f"object {name!r} exists", headers=_etag(current)
        )
    if condition.digest is not None and (
        not live or current is None or current.digest != condition.digest
    ):
        raise errors.PreconditionFailed(
            ErrorCode.OBJ_CHANGED,
            f"object {name!r} is not at the version If-Match names",
            headers=_etag(current) if live else None,
        )
    return current


def _chunk_data(message: StoredMessage, expected: int | None) -> bytes:
    """A chunk's bytes; ``expected``: the sequence it must be at (a gap is a lost chunk)."""
    if expected is not None and message.seq != expected:
        raise errors.UpstreamError(ErrorCode.OBJ_CORRUPT, "a chunk of the object is missing")
    return message.data


def _regular(info: ObjectInfo, first: StoredMessage, last: StoredMessage) -> int | None:
    """The chunk size, when chunk ``k`` is provably at stream sequence ``first + k`` and holds
    bytes ``k*size`` on; None when that cannot be shown.

    The chunks are contiguous in the stream when the first and the last are ``chunks - 1``
    apart (there are ``chunks`` messages on the subject in between, no room for others). They
    are all of the writer's ``max_chunk_size`` M but the last when the first is M and the last
    holds ``size - (chunks-1)*M`` bytes: the chunks in between then add up to
    ``(chunks-2)*M`` and none is over M, so each is M.
    """
    most = info.max_chunk_size
    if info.chunks == 1:
        return int(most or len(first.data)) if len(first.data) == info.size else None
    if not most or last.seq - first.seq + 1 != info.chunks:
        return None
    if len(first.data) != most or len(last.data) != info.size - (info.chunks - 1) * most:
        return None
    return int(most)


def _verify(info: ObjectInfo, seen: int, digest: bytes) -> None:
    expected = model.digest_bytes(info.digest)
    if seen != info.size or expected != digest:
        raise errors.UpstreamError(
            ErrorCode.OBJ_CORRUPT,
            f"object {info.name!r} does not match its size or digest: not served",
        )


def _info_of(message: StoredMessage) -> ObjectInfo:
    return model.parse_info(message.data, message.seq, message.time)


def _etag(info: ObjectInfo | None) -> dict[str, str] | None:
    return {"ETag": info.etag} if info is not None and info.digest else None


def _not_a_bucket(bucket: str) -> errors.Conflict:
    return errors.Conflict(
        ErrorCode.OBJ_NOT_A_BUCKET,
        f"stream {model.stream_name(bucket)!r} exists but is not an object bucket",
    )


def _status(bucket: str, info: dict[str, Any]) -> dict[str, Any]:
    config = info.get("config") or {}
    state = info.get("state") or {}
    return {
        "bucket": bucket,
        "description": config.get("description"),
        "ttl": (config.get("max_age") or 0) / 1e9,
        "storage": config.get("storage", "file"),
        "replicas": config.get("num_replicas", 1),
        "sealed": bool(config.get("sealed")),
        "size": state.get("bytes", 0),
        "max_bytes": config.get("max_bytes", -1),
        "compression": config.get("compression", "none") == "s2",
        "placement": config.get("placement"),
        "metadata": {
            k: v for k, v in (config.get("metadata") or {}).items() if not k.startswith("_nats")
        }
        or None,
        "stream": model.stream_name(bucket),
    }


def anyio_shield() -> anyio.CancelScope:
    """A cancel scope that lets the clean-up of a cancelled upload run to its end."""
    return anyio.CancelScope(shield=True)
