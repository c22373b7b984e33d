"""Publishing to streams: header allowlist, PubAck handling, batches with one result each."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client

from app import errors, validation
from app.auth.policy import Principal
from app.durations import nats_ttl
from app.errors import ErrorCode, NoResponders
from app.metrics import Metrics
from app.nats import features
from app.nats.jsapi import JetStreamApi, parse_response
from app.nats.pool import NatsPool
from app.nats.replies import Reply
from app.publish import atomic, schedules
from app.publish.schemas import PublishItem

log = logging.getLogger("jsgw.publish")

# Publish headers a client may set, by lower-case name, with their canonical NATS spelling
# (the server matches header names case-sensitively).
PUBLISH_HEADERS = {
    "nats-msg-id": "Nats-Msg-Id",
    "nats-expected-stream": "Nats-Expected-Stream",
    "nats-expected-last-sequence": "Nats-Expected-Last-Sequence",
    "nats-expected-last-subject-sequence": "Nats-Expected-Last-Subject-Sequence",
    "nats-expected-last-msg-id": "Nats-Expected-Last-Msg-Id",
    "nats-ttl": "Nats-TTL",
    **{name.lower(): name for name in schedules.HEADERS},
}
HTTP_ALIASES = {"idempotency-key": "nats-msg-id"}
USER_HEADER_PREFIX = "nats-header-"
_SEQUENCE_HEADERS = {"Nats-Expected-Last-Sequence", "Nats-Expected-Last-Subject-Sequence"}
_STATUS_PSEUDO_HEADERS = {"status", "description"}
# A PubAck as the server writes it for a stream without a domain, a stream name of plain
# characters (which JSON writes alike, escaped or not), and what publish() answers for it.
_PLAIN_PUBACK = re.compile(rb'\{"stream":"[A-Za-z0-9_-]+","seq":[1-9][0-9]{0,19}\}')
_NOT_DUPLICATE = b',"duplicate":false}'


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A validated message, ready to publish."""

    subject: str
    data: bytes
    headers: dict[str, str]
    confined: bool = False
    """The writer may not read the whole stream: JetStream's refusals, which can tell about
    other subjects' messages, are answered without what they say (:func:`scrubbed`)."""

    @property
    def size(self) -> int:
        return len(self.data) + sum(len(k) + len(v) + 4 for k, v in self.headers.items()) + 12


def http_publish_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """NATS headers from HTTP request headers: the allowlist and ``Nats-Header-<Name>``."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for raw_name, value in pairs:
        name = raw_name.lower()
        name = HTTP_ALIASES.get(name, name)
        if name in PUBLISH_HEADERS:
            _add(out, seen, PUBLISH_HEADERS[name], value)
        elif name.startswith(USER_HEADER_PREFIX):
            # HTTP header names arrive lower-cased; NATS header names are case-sensitive, so
            # user headers take the canonical MIME form (x-trace-id -> X-Trace-Id).
            user = _canonical(raw_name[len(USER_HEADER_PREFIX) :])
            _add(out, seen, _user_header_name(user), value)
    return _normalise(out)


def http_user_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """NATS headers from HTTP request headers: ``Nats-Header-<Name>`` only (core NATS, where
    the JetStream publish headers mean nothing)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for raw_name, value in pairs:
        if raw_name.lower().startswith(USER_HEADER_PREFIX):
            user = _canonical(raw_name[len(USER_HEADER_PREFIX) :])
            _add(out, seen, _user_header_name(user), value)
    return out


def message_headers(headers: dict[str, str] | None, msg_id: str | None) -> dict[str, str]:
    """NATS headers from a batch item: allowlisted ``Nats-*`` names and plain user headers."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for raw_name, value in (headers or {}).items():
        canonical = PUBLISH_HEADERS.get(raw_name.lower())
        if not isinstance(value, str):
            raise errors.InvalidInput(
                ErrorCode.HEADER_INVALID, f"header {raw_name!r} must be a string"
            )
        _add(out, seen, canonical or _user_header_name(raw_name), value)
    if msg_id is not None:
        _add(out, seen, "Nats-Msg-Id", msg_id)
    return _normalise(out)


def _canonical(name: str) -> str:
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def _user_header_name(name: str) -> str:
    validation.header_name(name)
    lowered = name.lower()
    if lowered.startswith("nats-") or lowered in _STATUS_PSEUDO_HEADERS:
        raise errors.InvalidInput(
            ErrorCode.HEADER_RESERVED,
            f"header {name!r} is reserved: only the documented Nats-* publish headers are passed",
        )
    return name


def _add(out: dict[str, str], seen: set[str], name: str, value: str) -> None:
    """``seen``: the names given so far, lower-cased (a name given twice in any case is
    refused; one set per message, so a message of many headers costs no more per header)."""
    validation.header_value(name, value)
    lowered = name.lower()
    if lowered in seen:
        raise errors.InvalidInput(
            ErrorCode.HEADER_DUPLICATE, f"header {name!r} is given more than once"
        )
    seen.add(lowered)
    out[name] = value


def _normalise(headers: dict[str, str]) -> dict[str, str]:
    for name in _SEQUENCE_HEADERS & headers.keys():
        value = headers[name].strip()
        if not (value.isascii() and value.isdigit()) or len(value) > validation.REVISION_DIGITS:
            raise errors.InvalidInput(
                ErrorCode.HEADER_INVALID, f"{name} must be a sequence number (up to 19 digits)"
            )
        headers[name] = str(int(value))
    if "Nats-Expected-Stream" in headers:
        validation.stream_name(headers["Nats-Expected-Stream"])
    for name in ("Nats-Msg-Id", "Nats-Expected-Last-Msg-Id"):
        if name in headers and not headers[name]:
            raise errors.InvalidInput(ErrorCode.HEADER_INVALID, f"{name} cannot be empty")
    if "Nats-TTL" in headers:
        headers["Nats-TTL"] = _ttl(headers["Nats-TTL"])
    return headers


def _ttl(value: str) -> str:
    try:
        return nats_ttl(value)
    except ValueError as exc:
        raise errors.InvalidInput(ErrorCode.HEADER_INVALID, f"Nats-TTL: {exc}") from None


def outgoing(subject: str, data: bytes, headers: dict[str, str], max_payload: int) -> Outgoing:
    subject = validation.publish_subject(subject)
    return fitting(Outgoing(subject, data, schedules.checked(subject, headers)), max_payload)


def fitting(message: Outgoing, max_payload: int) -> Outgoing:
    """``message`` (its subject and headers checked before), if it fits ``max_payload``."""
    if message.size > max_payload:
        raise errors.PayloadTooLarge(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {message.size} bytes is over the server's max_payload of {max_payload}",
        )
    return message


def batch_item(index: int, item: PublishItem, max_payload: int) -> Outgoing:
    """Validate one batch item; errors name the item's index."""
    try:
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            raise errors.InvalidInput(
                ErrorCode.REQUEST_INVALID, "data is not valid base64"
            ) from None
        return outgoing(item.subject, data, message_headers(item.headers, item.msg_id), max_payload)
    except errors.GatewayError as exc:
        exc.detail = f"messages[{index}]: {exc.detail}"
        raise


# -- subject-limited writers ---------------------------------------------------------------

# Preconditions JetStream checks against the whole stream, not the message's subject.
STREAM_WIDE_PRECONDITIONS = ("Nats-Expected-Last-Sequence", "Nats-Expected-Last-Msg-Id")
_SCOPED_IDS = ("Nats-Msg-Id", "Nats-Expected-Last-Msg-Id")
_ID_SCOPE_CONTEXT = b"jsgw-msg-id-scope\0"


def id_scope(principal: Principal) -> str:
    """The prefix of the Nats-Msg-Ids of a writer whose grant covers part of a stream:
    ``jsgw~<16 hex digits of SHA-256 over the token's name>~``, so no two token names share
    an id space and none is a prefix of another's."""
    digest = hashlib.sha256(_ID_SCOPE_CONTEXT + principal.name.encode()).hexdigest()
    return f"jsgw~{digest[:16]}~"


def for_writer(message: Outgoing, principal: Principal, stream: str, max_payload: int) -> Outgoing:
    """The message as ``principal`` may send it to ``stream``, whose capture of the subject
    it may write (checked before).

    A writer without write and read on the whole stream cannot learn or affect anything
    outside its grant: the stream-wide preconditions need read on the whole stream (403
    otherwise), its Nats-Msg-Id (and Nats-Expected-Last-Msg-Id) is scoped to the token
    (:func:`id_scope`), so de-duplication only ever meets its own ids (an id that matched
    another writer's would tell that message's sequence), and when it may not read the whole
    stream, JetStream's refusals are scrubbed. A writer and reader of the whole stream sends
    ids as given. The scoped message must still fit ``max_payload``.
    """
    if principal.anonymous:
        return message
    whole_read = principal.allows_all("read", "stream", stream)
    if not whole_read:
        for name in STREAM_WIDE_PRECONDITIONS:
            if name in message.headers:
                raise errors.Forbidden(
                    ErrorCode.AUTH_FORBIDDEN,
                    f"{name} compares with the last message of the whole stream {stream!r}: "
                    "it needs read on all of it, which this token does not have; "
                    "Nats-Expected-Last-Subject-Sequence checks the message's own subject",
                )
    headers = message.headers
    if not (whole_read and principal.allows_all("write", "stream", stream)):
        scope = id_scope(principal)
        headers = {
            name: scope + value if name in _SCOPED_IDS else value for name, value in headers.items()
        }
        if headers != message.headers:
            return fitting(replace(message, headers=headers, confined=not whole_read), max_payload)
    return replace(message, headers=headers, confined=not whole_read)


def scrubbed(error: errors.GatewayError) -> errors.GatewayError:
    """A publish refusal without JetStream's words, which may name another subject's last
    Nats-Msg-Id or sequence (for a writer that may not read the whole stream)."""
    nats = None
    if error.nats is not None:
        nats = {k: v for k, v in error.nats.items() if k != "description"}
    return errors.for_code(
        error.code, error.code.meaning, nats=nats, headers=error.headers, extra=error.extra
    )


def acknowledged(reply: Reply) -> bool:
    """Whether a publish's reply is a PubAck (stored), not a refusal.

    ``"error":`` can only be the key of an error object: in a JSON string its quotes would be
    escaped.
    """
    data = reply.data
    return not reply.raw_headers and data[:1] == b"{" and b'"error":' not in data


def answer(reply: Reply, message: Outgoing) -> dict[str, Any]:
    """The answer to a publish from its reply: the PubAck's fields, or the refusal."""
    try:
        ack = parse_response(reply.data)
    except errors.PreconditionFailed as exc:
        if message.confined:
            raise scrubbed(exc) from None
        raise
    if "stream" not in ack or "seq" not in ack:
        raise errors.UpstreamError(ErrorCode.JETSTREAM_BAD_RESPONSE, "the reply was not a PubAck")
    if not ack["seq"]:  # nats-server 2.10: a duplicate of a message still being stored
        raise errors.OutcomeUnknown(
            detail="a message with this Nats-Msg-Id is being stored right now: retry with "
            "the same Nats-Msg-Id to learn its sequence"
        )
    out = {"stream": ack["stream"], "seq": ack["seq"], "duplicate": bool(ack.get("duplicate"))}
    if ack.get("domain"):
        out["domain"] = ack["domain"]
    if "val" in ack:  # a counter's new value (ADR-49), answered to an increment
        out["val"] = ack["val"]
    return out


def answer_json(reply: Reply, message: Outgoing) -> bytes:
    """:func:`answer` as JSON. A plain PubAck (``{"stream":"<name>","seq":<n>}``, which the
    server writes from a template of its own: stream.go ``pubAck``) is answered from the
    server's bytes, without parsing them and encoding the same fields again."""
    if _PLAIN_PUBACK.fullmatch(reply.data) is not None:
        return reply.data[:-1] + _NOT_DUPLICATE
    return orjson.dumps(answer(reply, message))


class Publisher:
    def __init__(self, pool: NatsPool, js: JetStreamApi, metrics: Metrics) -> None:
        self.pool = pool
        self.js = js
        self._outcome_unknown = metrics.outcome_unknown
        self._nats_errors = metrics.nats_errors

    async def publish(
        self,
        message: Outgoing,
        client: Client | None = None,
        timeout: float | None = None,
        *,
        operation: str = "publish",
    ) -> dict[str, Any]:
        """Publish and wait for the PubAck; 2xx only once the stream stored the message.

        A refusal is confirmed before it is answered (``ReplyMux.request_write``): by sending
        the message again when it has a ``Nats-Msg-Id`` (the stream deduplicates it), else
        by waiting a short grace for a PubAck from another server. An outcome left unknown is
        counted under ``operation`` (``jsgw_publish_outcome_unknown_total``): ``publish``, or
        ``kv_write`` for the KV service's writes.
        """
        try:
            return answer(await self._request(message, client, timeout), message)
        except errors.OutcomeUnknown:
            self._outcome_unknown.labels(operation).inc()
            raise

    async def publish_json(self, message: Outgoing) -> bytes:
        """:meth:`publish`'s answer as JSON (:func:`answer_json`)."""
        try:
            return answer_json(await self._request(message, None, None), message)
        except errors.OutcomeUnknown:
            self._outcome_unknown.labels("publish").inc()
            raise

    async def _request(
        self, message: Outgoing, client: Client | None, timeout: float | None
    ) -> Reply:
        headers = message.headers
        if "Nats-TTL" in headers:  # an older server would store the message without it
            self.pool.require(features.MESSAGE_TTL)
        if schedules.SCHEDULE in headers:  # ... or store it as an ordinary message
            self.pool.require(*schedules.needs(headers))
        started = time.monotonic()
        try:
            return await self._send(message, client, timeout)
        except NoResponders:
            if client is not None:  # one of several sent in order: again, it would land behind
                raise await self._why_no_responders(message.subject) from None
            return await self.pool.sent_again(
                lambda: self._send(message, client, timeout),
                lambda: self._why_no_responders(message.subject),
                started,
                timeout,
            )

    def _send(
        self, message: Outgoing, client: Client | None, timeout: float | None
    ) -> Awaitable[Reply]:
        headers = message.headers
        return self.pool.request(
            message.subject,
            message.data,
            headers=headers or None,
            operation="publish",
            write=True,
            client=client,
            timeout=timeout,
            stored=acknowledged,
            resend="Nats-Msg-Id" in headers,
        )

    async def _why_no_responders(self, subject: str) -> errors.GatewayError:
        """Nobody took the message, so it is not stored: tell "no stream" from "no leader".

        In a cluster only the stream leader listens on the stream's subjects, so while a
        leader is being elected a publish also meets no responders: that is a 503 to retry,
        not a 404.

        The question waits no longer than a liveness probe (``JSGW_NATS_PROBE_TIMEOUT``, and
        never past the request timeout): the JetStream API answers at once while it has a
        meta leader, and nothing answers while the cluster elects one (the node that crashed
        led the stream and the meta group), when the write's remaining time is better spent
        sending it again.
        """
        settings = self.pool.settings
        retry = {"Retry-After": str(settings.retry_after)}
        try:
            found = await self.js.call(
                "stream.names",
                "STREAM",
                "NAMES",
                body={"subject": subject},
                timeout=min(settings.nats_probe_timeout, settings.request_timeout),
            )
        except errors.Unavailable as exc:
            if exc.nats is None:  # JetStream not enabled, or the connection dropped
                exc.headers = {**retry, **exc.headers}
                return exc
            found = None  # JetStream answered it cannot now (10008: no meta leader): retry
        except errors.Timeout:
            found = None  # cannot tell: answer what the client can retry
        if found is not None and not found.get("streams"):
            return errors.StreamNoMatch(detail=f"no stream captures subject {subject!r}")
        return errors.StreamUnavailable(
            detail=f"no stream answered the publish to {subject!r} (its stream has no leader right "
            "now, e.g. during an election): the message was not stored; retry shortly",
            headers=retry,
        )

    async def publish_atomic(self, messages: list[Outgoing]) -> dict[str, Any]:
        """Publish ``messages`` as one atomic batch (:mod:`app.publish.atomic`; checked and all
        to one stream before): ``{stream, seq, batch, count}`` once the stream stored them
        all, or the one refusal that stored none."""
        self.pool.require(features.ATOMIC_BATCH)
        if any("Nats-TTL" in m.headers for m in messages):
            self.pool.require(features.MESSAGE_TTL)
        for message in messages:
            self.pool.require(*schedules.needs(message.headers))
        started = time.monotonic()
        try:
            return await self._atomic(messages)
        except NoResponders:  # nobody took the commit: none of the batch is stored
            return await self.pool.sent_again(
                lambda: self._atomic(messages),
                lambda: self._why_no_responders(messages[-1].subject),
                started,
            )

    async def _atomic(self, messages: list[Outgoing]) -> dict[str, Any]:
        """One attempt at the atomic batch, under a batch id of its own."""
        batch_id = atomic.new_batch_id()
        framed = atomic.framed(messages, batch_id, self.pool.max_payload)
        try:
            replies = await self.pool.request_batch(framed, operation="publish_atomic")
        except errors.OutcomeUnknown as exc:
            self._outcome_unknown.labels("publish_atomic").inc()
            await self._abandon(atomic.abandon(batch_id, messages))
            exc.detail = (
                "NATS did not confirm the atomic batch in time: it is stored whole or not at "
                "all; read the stream (or resend it with Nats-Msg-Ids: a stored batch is "
                "then refused as publish.batch_duplicate) to find out"
            )
            raise
        return await self._atomic_outcome(replies, messages, batch_id)

    async def _atomic_outcome(
        self, replies: list[Reply | None], messages: list[Outgoing], batch_id: str
    ) -> dict[str, Any]:
        """The commit's PubAck, else the first refusal of any message (the commit itself
        says only "incomplete" when an earlier message was refused on its way)."""
        commit = replies[-1]
        if commit is None:  # (request_batch raises when the commit's reply does not come)
            raise errors.UpstreamError(
                ErrorCode.JETSTREAM_BAD_RESPONSE, "no reply to the commit of the atomic batch"
            )
        if commit.status == 503 and not commit.data:
            self._nats_errors.labels("publish_atomic", "no_responders").inc()
            raise NoResponders(ErrorCode.NATS_NO_RESPONDERS, "nobody took the batch's commit")
        refusal: errors.GatewayError | None = None
        for reply in replies:
            if reply is None or not reply.data:  # (an empty reply: staged)
                continue
            try:
                ack = parse_response(reply.data)
            except errors.GatewayError as exc:
                refusal = refusal or exc
                continue
            if reply is commit and ack.get("batch") == batch_id and "seq" in ack:
                out = {"stream": ack["stream"], "seq": ack["seq"], "batch": batch_id}
                return {**out, "count": ack.get("count", len(messages))}
        if refusal is None:
            raise errors.UpstreamError(
                ErrorCode.JETSTREAM_BAD_RESPONSE, "the reply to the commit was not a PubAck"
            )
        if any(m.confined for m in messages):
            raise scrubbed(refusal)
        raise refusal

    async def _abandon(self, message: tuple[str, dict[str, str]]) -> None:
        """Send the abandoning message of :func:`app.publish.atomic.abandon`, if any
        connection is up (best effort: the server abandons the batch in time anyway)."""
        subject, headers = message
        try:
            await self.pool.pick().publish(subject, b"", headers=headers)
        except (errors.Unavailable, nats.errors.Error):
            log.info("could not send the abandoning message of batch %s", headers)

    async def publish_batch(self, messages: list[Outgoing]) -> list[dict[str, Any]]:
        """Publish in order on one connection, all before any reply is awaited; one result each."""
        client = self.pool.pick()

        async def one(index: int, message: Outgoing) -> dict[str, Any]:
            try:
                return {"index": index, "ok": True, "ack": await self.publish(message, client)}
            except errors.GatewayError as exc:
                return {"index": index, "ok": False, "error": exc.problem()}

        tasks = [asyncio.ensure_future(one(i, m)) for i, m in enumerate(messages)]
        return list(await asyncio.gather(*tasks))
