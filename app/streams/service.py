"""Stream administration and single-message access over the JetStream API."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from app import errors
from app.durations import nats_time, ns_to_seconds
from app.errors import ErrorCode
from app.nats import features
from app.nats.direct import DirectGet, StoredMessage
from app.nats.jsapi import JetStreamApi
from app.streams.schemas import PurgeRequest, StreamConfig

# Duration fields (nanoseconds in NATS) of a StreamConfig, as paths into the dict.
_STREAM_DURATIONS = (
    ("max_age",),
    ("duplicate_window",),
    ("subject_delete_marker_ttl",),
    ("consumer_limits", "inactive_threshold"),
)
_LIST_PAGE = 256
_CAPTURING_TTL = 5.0
_CAPTURING_CACHE_SIZE = 10_000
_CAPTURING_IN_FLIGHT = 16  # STREAM.NAMES requests of one capturing_all at a time


def durations_out(config: dict[str, Any], paths: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """Copy of a NATS config with the given nanosecond durations turned into seconds."""
    out = dict(config)
    for path in paths:
        holder: dict[str, Any] | None = out
        for key in path[:-1]:
            child = holder.get(key) if holder is not None else None
            if holder is None or not isinstance(child, dict):
                holder = None
                break
            holder[key] = child = dict(child)
            holder = child
        if holder is not None and isinstance(holder.get(path[-1]), int):
            holder[path[-1]] = ns_to_seconds(holder[path[-1]])
    return out


def stream_info_out(info: dict[str, Any]) -> dict[str, Any]:
    state = dict(info.get("state") or {})
    for key in ("first_ts", "last_ts"):
        if key in state:
            state[key] = nats_time(state[key])
    out = {
        "config": durations_out(info.get("config") or {}, _STREAM_DURATIONS),
        "state": state,
        "created": nats_time(info.get("created")),
    }
    for key in ("cluster", "mirror", "sources"):
        if info.get(key):
            out[key] = info[key]
    return out


def _summary(info: dict[str, Any]) -> dict[str, Any]:
    config, state = info.get("config") or {}, info.get("state") or {}
    return {
        "name": config.get("name", ""),
        "subjects": config.get("subjects") or [],
        "messages": state.get("messages", 0),
        "bytes": state.get("bytes", 0),
        "first_seq": state.get("first_seq", 0),
        "last_seq": state.get("last_seq", 0),
        "consumer_count": state.get("consumer_count", 0),
        "created": nats_time(info.get("created")),
    }


def message_out(stream: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A ``STREAM.MSG.GET`` message in the API's Message JSON."""
    return StoredMessage.from_msg_get(stream, raw).to_json()


# What nats-server refuses to change in a stream's config (server/stream.go,
# configUpdateCheck), as the config's JSON has it, with its value when left out: an update
# that changes them is refused by the server with a plain 400, though the request is well
# formed and the stream is there.
_FIXED: tuple[tuple[str, object], ...] = (
    ("storage", "file"),
    ("allow_msg_counter", False),
    ("persist_mode", "default"),
)
_ONCE_ON = ("allow_msg_ttl", "allow_msg_schedules", "deny_delete", "deny_purge", "sealed")


def check_updatable(name: str, existing: dict[str, Any], body: dict[str, Any]) -> None:
    """409 stream.not_updatable for an update that changes what cannot change."""
    for field in _ONCE_ON:
        if existing.get(field) and not body.get(field):
            raise errors.Conflict(
                ErrorCode.STREAM_NOT_UPDATABLE,
                f"{field} of stream {name!r} is on and cannot be turned off",
            )
    for field, default in _FIXED:
        if (body.get(field) or default) != (existing.get(field) or default):
            raise errors.Conflict(
                ErrorCode.STREAM_NOT_UPDATABLE,
                f"the {field} of stream {name!r} is {existing.get(field) or default!r} and "
                "cannot change: delete and re-create it",
            )
    retention = (existing.get("retention") or "limits", body.get("retention") or "limits")
    if retention[0] != retention[1] and "workqueue" in retention:
        raise errors.Conflict(
            ErrorCode.STREAM_NOT_UPDATABLE,
            f"the retention of stream {name!r} is {retention[0]!r}: only limits and interest "
            "change into each other (workqueue neither way); delete and re-create it",
        )


async def create_or_update(
    js: JetStreamApi,
    direct: DirectGet,
    name: str,
    body: dict[str, Any],
    *,
    existing: dict[str, Any] | None,
) -> tuple[dict[str, Any], bool]:
    """Create the stream, or update it when it exists (``existing``: its config). Returns
    (the server's info, created)."""
    if existing is not None:
        check_updatable(name, existing, body)
    elif body.get("sealed"):
        raise errors.StreamNotFound(detail=f"there is no stream {name!r} to seal: create it first")
    direct.forget(name)  # its config is about to change
    try:
        if existing is None:
            try:
                return await js.call("stream.create", "STREAM", "CREATE", name, body=body), True
            except errors.StreamExists:
                pass  # created by someone else since we looked: update it as asked
        return await js.call("stream.update", "STREAM", "UPDATE", name, body=body), False
    finally:
        direct.forget(name)  # and what was read while it changed is dropped too


async def every_stream(
    js: JetStreamApi, subject: str | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The info of every stream (those on ``subject``, when given), paging ``STREAM.LIST``."""
    offset = 0
    while True:
        body: dict[str, Any] = {"offset": offset}
        if subject:
            body["subject"] = subject
        page = await js.call("stream.list", "STREAM", "LIST", body=body)
        batch = page.get("streams") or []
        for info in batch:
            yield info
        offset += len(batch)
        if not batch or offset >= int(page.get("total", 0)):
            return


class StreamService:
    def __init__(self, js: JetStreamApi, direct: DirectGet) -> None:
        self.js = js
        self.direct = direct
        self._capturing: dict[str, tuple[float, str | None]] = {}
        # Any stream or bucket created, changed or deleted through the gateway may capture
        # other subjects now.
        direct.on_forget.append(lambda _stream: self._capturing.clear())

    async def list(
        self,
        subject: str | None,
        offset: int,
        limit: int,
        visible: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Streams ``[offset, offset+limit)``, paging the server's 256-stream pages.

        With ``visible``, only the streams it admits count: the whole listing is read, and
        ``total``, ``offset`` and ``limit`` are of what it admits, so neither the page nor
        the total tells anything about the others.
        """
        if visible is not None:
            admitted = [s for s in await self._every(subject) if visible(s["name"])]
            return {
                "streams": admitted[offset : offset + limit],
                "total": len(admitted),
                "offset": offset,
                "limit": limit,
            }
        streams: list[dict[str, Any]] = []
        total = 0
        server_offset = offset
        while len(streams) < limit:
            page = await self._page(subject, server_offset)
            total = page.get("total", 0)
            batch = page.get("streams") or []
            streams.extend(_summary(info) for info in batch)
            server_offset += len(batch)
            if not batch or server_offset >= total or len(batch) < _LIST_PAGE:
                break
        return {"streams": streams[:limit], "total": total, "offset": offset, "limit": limit}

    async def _page(self, subject: str | None, offset: int) -> dict[str, Any]:
        body: dict[str, Any] = {"offset": offset}
        if subject:
            body["subject"] = subject
        return await self.js.call("stream.list", "STREAM", "LIST", body=body)

    async def _every(self, subject: str | None) -> builtins.list[dict[str, Any]]:
        return [_summary(info) async for info in every_stream(self.js, subject)]

    async def capturing(self, subject: str) -> str | None:
        """The stream that stores messages published to ``subject``, if any.

        Asked for every authorized publish, so answers are kept for a few seconds (bounded):
        which stream captures a subject changes only with stream configs.
        """
        now = time.monotonic()
        cached = self._capturing.get(subject)
        if cached is not None and cached[0] > now:
            return cached[1]
        result = await self.js.call("stream.names", "STREAM", "NAMES", body={"subject": subject})
        names = result.get("streams") or []
        stream = names[0] if names else None
        if len(self._capturing) >= _CAPTURING_CACHE_SIZE:
            self._capturing.clear()
        self._capturing[subject] = (now + _CAPTURING_TTL, stream)
        return stream

    async def meeting(self, filter_subject: str) -> builtins.list[str]:
        """The streams some of whose subjects the filter (or subject) matches."""
        names: builtins.list[str] = []
        while True:
            body = {"subject": filter_subject, "offset": len(names)}
            result = await self.js.call("stream.names", "STREAM", "NAMES", body=body)
            page = result.get("streams") or []
            names += page
            if not page or len(names) >= int(result.get("total") or 0):
                return names

    async def capturing_all(self, subjects: builtins.list[str]) -> dict[str, str | None]:
        """:meth:`capturing` of each subject, those not known asked for together (at most
        16 in flight)."""
        now = time.monotonic()
        found: dict[str, str | None] = {}
        missing = []
        for subject in subjects:
            cached = self._capturing.get(subject)
            if cached is not None and cached[0] > now:
                found[subject] = cached[1]
            else:
                missing.append(subject)
        if missing:
            # Each is a STREAM.NAMES request to the meta leader: a few at a time, so that
            # one HTTP request (up to 1,000 subjects) cannot flood it.
            in_flight = asyncio.Semaphore(_CAPTURING_IN_FLIGHT)

            async def one(subject: str) -> str | None:
                async with in_flight:
                    return await self.capturing(subject)

            answers = await asyncio.gather(*(one(subject) for subject in missing))
            found.update(zip(missing, answers, strict=True))
        return found

    async def info(self, name: str) -> dict[str, Any]:
        return stream_info_out(await self.js.call("stream.info", "STREAM", "INFO", name))

    async def put(self, name: str, config: StreamConfig) -> tuple[dict[str, Any], bool]:
        """Create the stream, or update it when it exists. Returns (info, created)."""
        if config.name is not None and config.name != name:
            raise errors.InvalidInput(
                ErrorCode.STREAM_NAME_MISMATCH,
                f"body name {config.name!r} differs from path {name!r}",
            )
        body = config.to_nats(name)
        self.js.pool.require(*features.of_stream(body))
        existing: dict[str, Any] | None = None
        with contextlib.suppress(errors.NotFound):
            existing = (await self.js.call("stream.info", "STREAM", "INFO", name))["config"]
        info, created = await create_or_update(self.js, self.direct, name, body, existing=existing)
        return stream_info_out(info), created

    async def delete(self, name: str) -> None:
        await self.js.call("stream.delete", "STREAM", "DELETE", name, write=True)
        self.direct.forget(name)

    async def purge(self, name: str, request: PurgeRequest) -> int:
        if request.seq is not None and request.keep is not None:
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID, "seq and keep cannot be used together"
            )
        body = request.model_dump(exclude_none=True)
        result = await self.js.call("stream.purge", "STREAM", "PURGE", name, body=body, write=True)
        return int(result.get("purged", 0))

    async def get_message(self, name: str, seq: int) -> dict[str, Any]:
        result = await self.js.call(
            "stream.msg_get", "STREAM", "MSG", "GET", name, body={"seq": seq}
        )
        return message_out(name, result.get("message") or {})

    async def delete_message(self, name: str, seq: int, *, erase: bool) -> None:
        await self.js.call(
            "stream.msg_delete",
            "STREAM",
            "MSG",
            "DELETE",
            name,
            body={"seq": seq, "no_erase": not erase},
            write=True,
        )
