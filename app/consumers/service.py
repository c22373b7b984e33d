"""Durable pull consumers: administration, fetch/next, consume, acks, unpinning.

Pinning keeps no state in the gateway: the pin id the server puts on messages goes back to the
HTTP client, which sends it with its next pull, so any replica can serve a pinned client.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import nats.errors
import orjson
from nats.aio.msg import Msg

from app import errors
from app.config import Settings
from app.consumers import config as consumer_config
from app.consumers import pull_options
from app.consumers.schemas import AckItem, ConsumeQuery, ConsumerConfig, PullOptions
from app.durations import time_for_nats
from app.errors import ErrorCode
from app.metrics import Metrics
from app.nats import acks, features, pull
from app.nats import headers as nats_headers
from app.nats.consume import Consume, Delivered, Failed, Pinned, Unpinned, Warn
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.nats.replies import Reply

_LIST_PAGE = 256
_MAX_REASON = 1024
# A consumer's filter subjects, as its info said them, are kept this long (bounded): every
# pull and ack of a token whose grants concern the stream checks them. A consumer re-created
# with another filter meanwhile is still caught, by the subjects it delivers (a ``Guard``).
FILTERS_TTL = 1.0
_FILTERS_CACHE_SIZE = 4096

Guard = Callable[[str], None]
"""Called with the subject of each message a consumer delivers, before the client sees it;
raises (:class:`app.errors.Forbidden`) for one the caller may not have."""


@dataclass(frozen=True, slots=True)
class Fetched:
    messages: list[dict[str, Any]]
    pin_id: str | None
    """The pin id the client should send with its next pull; None: send none."""


class ConsumerService:
    def __init__(
        self,
        pool: NatsPool,
        js: JetStreamApi,
        settings: Settings,
        ack_secret: bytes,
        metrics: Metrics | None = None,
    ) -> None:
        self.pool = pool
        self.js = js
        self.settings = settings
        self._secret = ack_secret
        self._acks_unknown = None if metrics is None else metrics.outcome_unknown.labels("ack")
        self._filters: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}

    # -- administration --------------------------------------------------------------------

    async def list(
        self,
        stream: str,
        offset: int,
        limit: int,
        visible: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Consumers ``[offset, offset+limit)``, paging the server's 256-consumer pages.

        With ``visible``, only the consumers it admits (by name) count: the whole listing is
        read, and ``total`` is of what it admits."""
        if visible is not None:
            admitted = [c for c in await self._every(stream) if visible(c.get("name", ""))]
            return {
                "consumers": admitted[offset : offset + limit],
                "total": len(admitted),
                "offset": offset,
                "limit": limit,
            }
        consumers: list[dict[str, Any]] = []
        total = 0
        server_offset = offset
        while len(consumers) < limit:
            page = await self.js.call(
                "consumer.list", "CONSUMER", "LIST", stream, body={"offset": server_offset}
            )
            total = page.get("total", 0)
            batch = page.get("consumers") or []
            consumers.extend(consumer_config.consumer_info_out(info) for info in batch)
            server_offset += len(batch)
            if not batch or server_offset >= total or len(batch) < _LIST_PAGE:
                break
        return {"consumers": consumers[:limit], "total": total, "offset": offset, "limit": limit}

    async def _every(self, stream: str) -> builtins.list[dict[str, Any]]:
        consumers: builtins.list[dict[str, Any]] = []
        while True:
            page = await self.js.call(
                "consumer.list", "CONSUMER", "LIST", stream, body={"offset": len(consumers)}
            )
            batch = page.get("consumers") or []
            consumers.extend(consumer_config.consumer_info_out(info) for info in batch)
            if not batch or len(consumers) >= page.get("total", 0):
                return consumers

    async def info(self, stream: str, name: str) -> dict[str, Any]:
        return consumer_config.consumer_info_out(await self._info(stream, name))

    async def _info(self, stream: str, name: str) -> dict[str, Any]:
        info = await self.js.call("consumer.info", "CONSUMER", "INFO", stream, name)
        self._remember_filters(stream, name, info.get("config") or {})
        return info

    def _remember_filters(self, stream: str, name: str, config: dict[str, Any]) -> None:
        filters = config.get("filter_subjects") or (
            [config["filter_subject"]] if config.get("filter_subject") else []
        )
        if len(self._filters) >= _FILTERS_CACHE_SIZE:
            self._filters.clear()
        self._filters[stream, name] = (time.monotonic() + FILTERS_TTL, tuple(filters))

    async def filters(self, stream: str, name: str) -> tuple[str, ...]:
        """The consumer's filter subjects as the server has them (empty: the whole stream),
        at most :data:`FILTERS_TTL` old; 404 when the consumer does not exist."""
        cached = self._filters.get((stream, name))
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        await self._info(stream, name)
        return self._filters[stream, name][1]

    def forget_filters(self, stream: str, name: str) -> None:
        self._filters.pop((stream, name), None)

    async def put(
        self, stream: str, name: str, config: ConsumerConfig
    ) -> tuple[dict[str, Any], bool]:
        """Create the consumer, or update it when it exists. Returns (info, created)."""
        body = consumer_config.to_nats(name, config)
        self.pool.require(*features.of_consumer(body))
        try:
            await self._info(stream, name)
        except errors.ConsumerNotFound:
            try:
                return consumer_config.consumer_info_out(
                    await self._create(stream, body, "create")
                ), True
            except errors.ConsumerExists:
                pass  # created by someone else between our INFO and CREATE: update it
        return consumer_config.consumer_info_out(await self._create(stream, body, "update")), False

    async def create(self, stream: str, name: str, config: ConsumerConfig) -> dict[str, Any]:
        """Create the consumer only: the server checks the config first, then answers 409
        ``consumer.exists`` when one of the name exists with another config (one with the
        same config is answered as it is)."""
        body = consumer_config.to_nats(name, config)
        self.pool.require(*features.of_consumer(body))
        return consumer_config.consumer_info_out(await self._create(stream, body, "create"))

    async def _create(self, stream: str, config: dict[str, Any], action: str) -> dict[str, Any]:
        request = {"stream_name": stream, "config": config, "action": action}
        info = await self.js.call(
            f"consumer.{action}", "CONSUMER", "CREATE", stream, config["name"], body=request
        )
        self._remember_filters(stream, config["name"], info.get("config") or {})
        return info

    async def delete(self, stream: str, name: str) -> None:
        await self.js.call("consumer.delete", "CONSUMER", "DELETE", stream, name, write=True)
        self.forget_filters(stream, name)

    async def unpin(self, stream: str, name: str, group: str) -> None:
        """Clear the group's pin; the server pins the next client that pulls (ADR-42)."""
        self.pool.require(features.PRIORITY_GROUPS)
        await self.js.call(
            "consumer.unpin", "CONSUMER", "UNPIN", stream, name, body={"group": group}
        )

    async def pause(self, stream: str, name: str, until: str | int | float) -> dict[str, Any]:
        """Pause the consumer until a time (or for a duration): it delivers nothing until
        then, and pulls wait (``$JS.API.CONSUMER.PAUSE``, nats-server 2.11)."""
        self.pool.require(features.CONSUMER_PAUSE)
        end = consumer_config.pause_until(until, datetime.now(UTC))
        return await self._pause(stream, name, {"pause_until": time_for_nats(end)})

    async def resume(self, stream: str, name: str) -> dict[str, Any]:
        """End a pause now (a consumer that is not paused stays as it is)."""
        self.pool.require(features.CONSUMER_PAUSE)
        return await self._pause(stream, name, {})

    async def _pause(self, stream: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.js.call(
            "consumer.pause", "CONSUMER", "PAUSE", stream, name, body=body, write=True
        )
        return consumer_config.pause_state_out(response)

    # -- fetch and next --------------------------------------------------------------------

    async def fetch(
        self,
        stream: str,
        name: str,
        options: PullOptions,
        pin_id: str | None,
        guard: Guard | None = None,
    ) -> Fetched:
        """One pull: what arrived before it ended (404/408 are no errors), or the refusal.

        With a ``guard``, a delivered message it refuses refuses the whole pull: every
        message of it is nak'ed (delivered again at once, to a client that may have it).
        """
        request = pull_options.fetch_request(options, self.settings, pin_id)
        bytes_mode = request.max_bytes > 0
        if bytes_mode or request.group is not None:
            # The server ignores a group on a consumer without groups, and refuses a byte
            # fetch whose large batch is over max_batch: look at the config first.
            config = (await self._info(stream, name)).get("config") or {}
            if bytes_mode and config.get("max_batch"):
                request = replace(request, batch=min(request.batch, config["max_batch"]))
            pull_options.check_against(config, request, bytes_mode=bytes_mode)
        timeout = request.expires + pull.CLIENT_MARGIN if request.expires_ns else self.pool.timeout
        subject = self.js.subject("CONSUMER", "MSG", "NEXT", stream, name)
        client = self.pool.pick()

        def pulled() -> Awaitable[pull.FetchOutcome]:
            return self.pool.observe(
                "consumer.fetch", lambda: pull.fetch(client, subject, request, timeout=timeout)
            )

        started = time.monotonic()
        outcome = await pulled()
        if outcome.status is not None and outcome.status.no_responders and not outcome.messages:
            # Nobody took the pull (the consumer's leader just changed, its subscription not
            # yet on the gateway's server): nothing was delivered, so it is asked again.
            with self.pool.within(started, timeout):
                for pause in self.pool.untaken_pauses():
                    await asyncio.sleep(pause)
                    outcome = await pulled()
                    if outcome.status is None or not outcome.status.no_responders:
                        break
        if guard is not None:
            await self._guarded(stream, name, outcome.messages, guard)
        messages = [self._delivered(stream, name, msg) for msg in outcome.messages]
        status = outcome.status
        if status is None:
            if outcome.stalled and not messages:
                raise errors.Timeout(
                    ErrorCode.NATS_TIMEOUT,
                    "the server neither ended the pull nor sent heartbeats in time",
                )
        elif status.no_responders:
            await self._info(stream, name)  # raises 404 when the consumer or stream is gone
            raise errors.Unavailable(
                ErrorCode.JETSTREAM_UNAVAILABLE,
                "the consumer did not take the pull request; retry shortly",
                headers={"Retry-After": str(self.settings.retry_after)},
            )
        elif status.pin_lost:
            if not messages:
                raise status.error()
            return Fetched(messages, None)  # delivered before the pin moved: keep them, drop the id
        elif not status.ends_quietly:
            raise status.error()
        return Fetched(messages, _pin_of(outcome.messages) or request.pin_id)

    async def _guarded(
        self, stream: str, name: str, msgs: builtins.list[Msg], guard: Guard
    ) -> None:
        try:
            for msg in msgs:
                guard(msg.subject)
        except errors.Forbidden:
            self.forget_filters(stream, name)
            await self._nak(msgs)
            raise

    async def _nak(self, msgs: builtins.list[Msg]) -> None:
        """Give messages back undelivered (best effort: else they return after ack_wait)."""
        targets = [(msg.reply, b"-NAK") for msg in msgs if msg.reply]
        if targets:
            with contextlib.suppress(errors.GatewayError):
                await self.pool.requests(targets, operation="consumer.ack")

    def _delivered(self, stream: str, name: str, msg: Msg) -> dict[str, Any]:
        """Message JSON plus ``ack_token``, ``delivered``, ``consumer_seq``, ``pending``."""
        meta = acks.parse_ack_subject(msg.reply)
        if meta is None or (meta.stream, meta.consumer) != (stream, name):
            raise errors.UpstreamError(
                ErrorCode.CONSUMER_BAD_DELIVERY,
                "the server delivered a message without a valid ack subject",
            )
        return {
            "stream": stream,
            "subject": msg.subject,
            "seq": meta.stream_seq,
            "time": _time_from_ns(meta.timestamp_ns),
            "headers": nats_headers.from_nats_py(msg.headers),
            "data": base64.b64encode(msg.data).decode(),
            "ack_token": acks.sign(self._secret, stream, name, msg.reply),
            "delivered": meta.delivered,
            "consumer_seq": meta.consumer_seq,
            "pending": meta.pending,
        }

    # -- consume ---------------------------------------------------------------------------

    async def consume(
        self,
        stream: str,
        name: str,
        query: ConsumeQuery,
        pin_id: str | None,
        guard: Guard | None = None,
    ) -> AsyncIterator[dict[str, str]]:
        """Check everything, then return the SSE events of an ADR-37 consume.

        Errors found here are answered as problem+json; once streaming, they become an
        ``error`` event and the stream ends.
        """
        config = (await self._info(stream, name)).get("config") or {}
        options = pull_options.consume_options(query, self.settings, pin_id, config)
        session = Consume(
            self.pool,
            self.js.subject("CONSUMER", "MSG", "NEXT", stream, name),
            options,
            check=lambda: self._info(stream, name),
        )
        return self._events(stream, name, options.template.group, session, guard)

    async def _events(
        self, stream: str, name: str, group: str | None, session: Consume, guard: Guard | None
    ) -> AsyncIterator[dict[str, str]]:
        async for event in session.events():
            if isinstance(event, Delivered):
                try:
                    if guard is not None:
                        await self._guarded(stream, name, [event.msg], guard)
                    message = self._delivered(stream, name, event.msg)
                except errors.GatewayError as exc:
                    yield _sse("error", exc.problem())
                    return
                yield {"event": "message", "id": str(message["seq"]), "data": _json(message)}
            elif isinstance(event, Pinned):
                yield _sse("pinned", {"group": group, "pin_id": event.pin_id})
            elif isinstance(event, Unpinned):
                yield _sse("unpinned", {"group": group, "pin_id": event.pin_id})
            elif isinstance(event, Warn):
                yield _sse("warning", {"code": event.code, "detail": event.detail})
            elif isinstance(event, Failed):
                yield _sse("error", event.error.problem())

    # -- acks ------------------------------------------------------------------------------

    async def ack(
        self, stream: str, name: str, items: builtins.list[AckItem]
    ) -> builtins.list[dict[str, Any]]:
        """Every token is verified first: one bad token rejects the batch, nothing is sent.
        Then each ack is sent with a reply subject and counts only once the server confirmed
        it (what nats-py's ``ack_sync`` does); one result per ack."""
        if len(items) > self.settings.max_fetch_messages:
            raise errors.PayloadTooLarge(
                ErrorCode.ACK_BATCH_TOO_LARGE,
                f"at most {self.settings.max_fetch_messages} acks per request",
            )
        prepared = [self._prepare(stream, name, i, item) for i, item in enumerate(items)]
        targets = [(subject.subject, payload) for subject, payload in prepared]
        started = time.monotonic()
        replies = await self.pool.requests(targets, operation="consumer.ack")
        gone = False
        if any(isinstance(reply, nats.errors.NoRespondersError) for reply in replies):
            gone = await self._acks_again(stream, name, targets, replies, started)
        if self._acks_unknown is not None:
            # The acks _ack_result answers nats.outcome_unknown: no confirmation in time.
            unknown = sum(isinstance(reply, nats.errors.TimeoutError) for reply in replies)
            if unknown:
                self._acks_unknown.inc(unknown)
        return [
            _ack_result(index, subject, reply, gone)
            for index, ((subject, _), reply) in enumerate(zip(prepared, replies, strict=True))
        ]

    async def _acks_again(
        self,
        stream: str,
        name: str,
        targets: builtins.list[tuple[str, bytes]],
        replies: builtins.list[Reply | Exception],
        started: float,
    ) -> bool:
        """Acks nobody took, sent again (in ``replies``' places) as the pool paces what
        nobody took: right after the consumer's leader changed, its subscription has not
        reached the gateway's server yet, and an ack is safe to send again. Whether the
        consumer is gone, for those still not taken (else it has no leader for now)."""
        with self.pool.within(started):
            for pause in self.pool.untaken_pauses():
                await asyncio.sleep(pause)
                untaken = [
                    i for i, r in enumerate(replies) if isinstance(r, nats.errors.NoRespondersError)
                ]
                again = await self.pool.requests(
                    [targets[i] for i in untaken], operation="consumer.ack"
                )
                for i, reply in zip(untaken, again, strict=True):
                    replies[i] = reply
                if not any(isinstance(r, nats.errors.NoRespondersError) for r in again):
                    return False
            try:
                await self._info(stream, name)
            except errors.NotFound:
                return True
            except errors.GatewayError:
                pass  # cannot tell: answered as a consumer without a leader, to retry
        return False

    def _prepare(
        self, stream: str, name: str, index: int, item: AckItem
    ) -> tuple[acks.AckSubject, bytes]:
        try:
            return acks.verify(self._secret, stream, name, item.token), _ack_payload(item)
        except errors.GatewayError as exc:
            exc.detail = f"acks[{index}]: {exc.detail}"
            raise


def _ack_result(
    index: int, subject: acks.AckSubject, reply: Reply | Exception, gone: bool
) -> dict[str, Any]:
    """What became of one ack: confirmed by the server (any reply), or why not (``gone``:
    nobody took it because the consumer is not there)."""
    result: dict[str, Any] = {"index": index, "ok": True, "seq": subject.stream_seq}
    if isinstance(reply, nats.errors.NoRespondersError) and gone:
        error: errors.GatewayError = errors.ConsumerNotFound(
            detail="nobody takes acks for this consumer: it was deleted"
        )
    elif isinstance(reply, nats.errors.NoRespondersError):
        error = errors.for_code(
            ErrorCode.CONSUMER_OFFLINE,
            "nobody took the ack: the consumer has no leader right now (e.g. during an "
            "election); the ack was not applied. Acks are safe to send again.",
        )
    elif isinstance(reply, nats.errors.TimeoutError):
        error = errors.OutcomeUnknown(
            detail="the server did not confirm the ack in time: it may or may not be "
            "applied. Acks are safe to send again."
        )
    elif isinstance(reply, Exception):
        error = errors.Unavailable(
            ErrorCode.NATS_UNAVAILABLE, "the NATS connection is down; the ack was not sent"
        )
    else:
        return result
    result.update(ok=False, error=error.problem())
    return result


def _ack_payload(item: AckItem) -> bytes:
    """The ack body the server expects for each kind (see consumer.go processAck)."""
    if item.delay is not None and item.kind != "nak":
        raise errors.InvalidInput(ErrorCode.ACK_INVALID, "delay is for kind 'nak' only")
    if item.reason is not None and item.kind != "term":
        raise errors.InvalidInput(ErrorCode.ACK_INVALID, "reason is for kind 'term' only")
    if item.kind == "ack":
        return b"+ACK"
    if item.kind == "wpi":
        return b"+WPI"
    if item.kind == "nak":
        return b"-NAK " + orjson.dumps({"delay": item.delay}) if item.delay else b"-NAK"
    reason = item.reason or ""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in reason):
        raise errors.InvalidInput(ErrorCode.ACK_INVALID, "reason cannot contain control characters")
    return b"+TERM " + reason.encode() if reason else b"+TERM"


def _pin_of(messages: list[Msg]) -> str | None:
    for msg in reversed(messages):
        if msg.headers and msg.headers.get(pull.PIN_HEADER):
            return msg.headers[pull.PIN_HEADER]
    return None


_second_text: tuple[int, str] = (-1, "")  # the last second formatted, and its text


def _time_from_ns(ns: int) -> str:
    """A Unix time in nanoseconds (from the ack subject) as RFC 3339 UTC, to the nanosecond.

    The messages of a fetch were mostly stored within the same second: its text is formatted
    once and kept."""
    global _second_text
    seconds, fraction = divmod(ns, 1_000_000_000)
    known, text = _second_text
    if seconds != known:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second_text = (seconds, text)
    return f"{text}.{fraction:09d}Z"


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _sse(event: str, data: Any) -> dict[str, str]:
    return {"event": event, "data": _json(data)}
