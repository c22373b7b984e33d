"""Reads by Direct Get: single messages, batches, consistent multi-subject reads.

This module turns the HTTP API's parameters into Direct Get requests (validating every
subject first) and leaves the wire protocol to :mod:`app.nats.direct`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from app import errors, validation
from app.durations import parse_time, start_time_for_nats
from app.errors import ErrorCode
from app.nats.direct import DirectGet, EndOfBatch, StoredMessage
from app.nats.jsapi import JetStreamApi
from app.nats.ranges import RangeRead

MAX_SEQ = 2**64 - 1


@dataclass(frozen=True, slots=True)
class SingleQuery:
    seq: int | None = None
    last_by_subj: str | None = None
    next_by_subj: str | None = None
    start_time: str | None = None

    def request(self) -> dict[str, Any]:
        """The Direct Get request body; refuses combinations the server cannot answer."""
        given = {k: v for k, v in self._fields().items() if v is not None}
        if not given:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID,
                "give one of seq, last_by_subj, next_by_subj or start_time",
            )
        if self.last_by_subj is not None and len(given) > 1:
            raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, "last_by_subj cannot be combined")
        if self.start_time is not None and self.seq is not None:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID, "seq and start_time cannot be combined"
            )
        for name in ("last_by_subj", "next_by_subj"):
            value = given.get(name)
            if value is not None:
                # A wildcard here would read an arbitrary subject's message (an arbitrary key).
                _literal(name, value)
        if self.start_time is not None:
            given["start_time"] = nats_time_param("start_time", self.start_time)
        return given

    def _fields(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "last_by_subj": self.last_by_subj,
            "next_by_subj": self.next_by_subj,
            "start_time": self.start_time,
        }


def _literal(name: str, value: str) -> str:
    try:
        return validation.subject(value)
    except errors.InvalidInput as exc:
        raise errors.InvalidInput(exc.code, f"{name}: {exc.detail}") from None


def nats_time_param(name: str, value: str) -> str:
    try:
        return start_time_for_nats(parse_time(value))
    except ValueError as exc:
        raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, f"{name}: {exc}") from None


class DirectService:
    def __init__(self, direct: DirectGet, js: JetStreamApi) -> None:
        self.direct = direct
        self.js = js

    async def get(self, stream: str, query: SingleQuery, *, leader: bool = False) -> StoredMessage:
        request = query.request()
        if "start_time" in request:  # (nats-server 2.10 answers a message get "bad request")
            self.direct.require_batches()
        if not leader:
            return await self.direct.get(stream, request)
        # Read-after-write: the stream leader answers $JS.API.STREAM.MSG.GET.
        result = await self.js.call("stream.msg_get", "STREAM", "MSG", "GET", stream, body=request)
        return StoredMessage.from_msg_get(stream, result.get("message") or {})

    async def last_for(self, stream: str, subject: str) -> StoredMessage:
        return await self.direct.last_for(stream, _literal("subject", subject))

    def batch(
        self,
        stream: str,
        query: SingleQuery,
        *,
        limit: int,
        max_bytes: int | None,
    ) -> AsyncIterator[list[StoredMessage] | EndOfBatch]:
        """The messages a page at a time (lists), then the end of the batch."""
        if query.last_by_subj is not None:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID,
                "last_by_subj reads one message: use multi for several subjects",
            )
        request: dict[str, Any] = query.request() if any(query._fields().values()) else {"seq": 1}
        return self.direct.batch(
            stream,
            seq=request.get("seq"),
            next_by_subj=request.get("next_by_subj"),
            start_time=request.get("start_time"),
            limit=limit,
            max_bytes=max_bytes,
        )

    def read_range(
        self, stream: str, start_seq: int, end_seq: int | None, subject: str | None
    ) -> AsyncIterator[list[StoredMessage] | EndOfBatch]:
        """``start_seq..end_seq`` (to the stream's last sequence when the read starts) through
        an ordered consumer, in pages: any stream, ``allow_direct`` or not; then one EOB."""
        if subject is not None:
            subject = validation.subject_filter(subject)
        last = end_seq if end_seq is not None else MAX_SEQ
        return RangeRead(self.js, stream, start_seq, last, filter_subject=subject).items()

    async def multi(
        self,
        stream: str,
        subjects: list[str],
        *,
        up_to_seq: int | None,
        up_to_time: str | None,
        page_size: int | None,
    ) -> tuple[int, list[StoredMessage]]:
        """Last message per subject, all as of one sequence; returns (up_to_seq, messages)."""
        if up_to_seq is not None and up_to_time is not None:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID, "up_to_seq and up_to_time exclude each other"
            )
        time_param = nats_time_param("up_to_time", up_to_time) if up_to_time else None
        self.direct.check_batches(stream)  # (before the stream's info is asked for nothing)
        pinned = await self.direct.resolve_up_to(stream, up_to_seq, time_param)
        if pinned == 0:
            return 0, []
        messages = [m async for m in self.direct.multi_last(stream, subjects, pinned, page_size)]
        messages.sort(key=lambda m: m.seq)
        return pinned, messages
