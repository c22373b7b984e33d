"""The error taxonomy: domain errors, NATS/JetStream error mapping, RFC 9457 problem+json.

Services raise the classes below; nothing else in the gateway picks an HTTP status for an
error. JetStream API errors are mapped by their numeric ``err_code``, never by text.

Every ``code`` the gateway answers is a member of :class:`ErrorCode`, which says the class
that carries it (and so its status) and what it means. The hierarchy::

    GatewayError                   (500; http.error, gateway.internal)
    ├── InvalidInput               400
    ├── Unauthorized               401
    ├── Forbidden                  403
    ├── NotFound                   404
    │   ├── StreamNotFound         stream.not_found
    │   ├── StreamDeleted          stream.deleted
    │   ├── StreamNoMatch          stream.no_match
    │   ├── ConsumerNotFound       consumer.not_found
    │   └── MessageNotFound        message.not_found
    ├── MethodNotAllowed           405
    ├── NotAcceptable              406
    ├── Conflict                   409
    │   ├── StreamExists           stream.exists
    │   ├── ConsumerExists         consumer.exists
    │   ├── DirectNotAllowed       direct.not_allowed
    │   └── TtlDisabled            publish.ttl_disabled
    ├── PreconditionFailed         412
    ├── PayloadTooLarge            413
    ├── RangeNotSatisfiable        416
    ├── Locked                     423
    ├── HeadTooLarge               431
    ├── TooManyRequests            429
    ├── Unsupported                501
    ├── UpstreamError              502
    ├── Unavailable                503
    │   └── StreamUnavailable      stream.unavailable
    ├── NoResponders               503 (not an Unavailable: callers turn it into one)
    └── Timeout                    504
        └── OutcomeUnknown         nats.outcome_unknown

A code that some code catches has a class of its own, and only that class carries it (the
constructor refuses anything else), so ``except errors.StreamNotFound`` cannot miss one.
Codes are compared nowhere: catch the class.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from http import HTTPStatus
from typing import Any, ClassVar

log = logging.getLogger("jsgw.errors")

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://jsgw.dev/problems/"


class GatewayError(Exception):
    """Base of every error the gateway answers with a problem+json document."""

    status: int = 500
    title: str | None = None
    code: ErrorCode
    own_code: ClassVar[ErrorCode | None] = None
    """Set on a class that carries one code of its own (then the code may be left out)."""

    def __init__(
        self,
        code: ErrorCode | None = None,
        detail: str = "",
        *,
        status: int | None = None,
        nats: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        code = _checked(type(self), code)
        super().__init__(detail or code.value)
        self.code = code
        if status is not None:
            self.status = status
        self.detail = detail
        self.nats = nats
        self.headers = headers or {}
        self.extra = extra or {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("own_code")
        if code is not None:
            if not issubclass(cls, code.status_class):
                raise TypeError(f"{cls.__name__} carries {code}, a {code.status_class.__name__}")
            if code in _OWNERS:
                raise TypeError(f"{code} is already carried by {_OWNERS[code].__name__}")
            _OWNERS[code] = cls

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"{PROBLEM_TYPE_BASE}{self.code}",
            "title": self.title or HTTPStatus(self.status).phrase,
            "status": self.status,
            "detail": self.detail,
            "code": self.code.value,
        }
        if instance:
            body["instance"] = instance
        if self.nats:
            body["nats"] = self.nats
        body.update(self.extra)
        return body


def _checked(cls: type[GatewayError], code: ErrorCode | None) -> ErrorCode:
    """``code``, when ``cls`` is the one class that carries it; a TypeError otherwise."""
    if code is None:
        code = cls.own_code
        if code is None:
            raise TypeError(f"{cls.__name__} needs an ErrorCode")
    if not isinstance(code, ErrorCode):
        raise TypeError(f"an error code is an ErrorCode member, not {code!r}")
    if code.error_class is not cls:
        raise TypeError(f"{code} is raised as {code.error_class.__name__}, not {cls.__name__}")
    return code


# -- the status classes -------------------------------------------------------------------


class InvalidInput(GatewayError):
    status = 400


class Unauthorized(GatewayError):
    status = 401


class Forbidden(GatewayError):
    status = 403


class NotFound(GatewayError):
    status = 404


class MethodNotAllowed(GatewayError):
    status = 405


class NotAcceptable(GatewayError):
    status = 406


class Conflict(GatewayError):
    status = 409


class PreconditionFailed(GatewayError):
    status = 412


class PayloadTooLarge(GatewayError):
    status = 413


class RangeNotSatisfiable(GatewayError):
    status = 416


class Locked(GatewayError):
    status = 423


class HeadTooLarge(GatewayError):
    """A request head over the gateway's bounds (431 Request Header Fields Too Large)."""

    status = 431


class TooManyRequests(GatewayError):
    status = 429


class Unsupported(GatewayError):
    """The NATS server lacks a feature the request needs."""

    status = 501


class UpstreamError(GatewayError):
    """JetStream answered with an error the gateway has no better mapping for."""

    status = 502


class Unavailable(GatewayError):
    status = 503


class NoResponders(GatewayError):
    """Nobody listens on the subject: no stream captures it, or JetStream is not there.

    Not an :class:`Unavailable`: the callers of the pool find out which, and answer that."""

    status = 503


class Timeout(GatewayError):
    status = 504


# -- the registry -------------------------------------------------------------------------


class ErrorCode(StrEnum):
    """Every ``code`` the gateway answers: the class that carries it, and what it means.

    The values are stable (clients branch on them); each has a page at its ``type`` URL,
    ``https://jsgw.dev/problems/<code>`` (docs/problems/, written by ``jsgw docs``).
    """

    status_class: type[GatewayError]
    meaning: str

    def __new__(cls, value: str, status_class: type[GatewayError], meaning: str) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status_class = status_class
        member.meaning = meaning
        return member

    @property
    def error_class(self) -> type[GatewayError]:
        """The class that carries this code: its own class if it has one, else its status's."""
        return _OWNERS.get(self, self.status_class)

    @property
    def status(self) -> int:
        return self.status_class.status

    # A table, one member per entry: code, status class, meaning (fmt: off keeps it one).
    # fmt: off
    # -- 400 -------------------------------------------------------------------------------
    REQUEST_INVALID = "request.invalid", InvalidInput, (
        "A parameter, query or body field is malformed, out of range or conflicts with "
        "another; `detail` (and `errors`, for body and query validation) says which: fix it."
    )
    HEADER_INVALID = "header.invalid", InvalidInput, (
        "A header name or value is not allowed (control characters, too long, not a number "
        "where one is expected): fix the header."
    )
    HEADER_DUPLICATE = "header.duplicate", InvalidInput, (
        "A header the gateway reads is given more than once: send it once."
    )
    HEADER_RESERVED = "header.reserved", InvalidInput, (
        "A Nats-* header that is not one of the documented publish headers: leave it out."
    )
    SUBJECT_INVALID = "subject.invalid", InvalidInput, (
        "Not a valid subject (empty token, whitespace, wildcard, too long): fix the subject."
    )
    SUBJECT_FILTER_INVALID = "subject.filter_invalid", InvalidInput, (
        "Not a valid subject filter ('*' and '>' only as whole tokens, '>' last): fix it."
    )
    SUBJECT_RESERVED = "subject.reserved", Forbidden, (
        "The subject is in a reserved namespace ($JS, $SYS, _INBOX...) and cannot be "
        "published to through the gateway."
    )
    NATS_SUBJECT_RESERVED = "nats.subject_reserved", InvalidInput, (
        "Core publish, request and subscribe do not reach the server's and the gateway's own "
        "namespaces: subjects whose first token starts with '$' ($JS, $KV, $O, $SYS...), "
        "'_INBOX', '_R_' or '_GR_', and subscriptions whose first token is a wildcard."
    )
    NATS_QUEUE_INVALID = "nats.queue_invalid", InvalidInput, (
        "Not a valid queue group name: 1-128 letters, digits, '-', '_', '.', '=' or '/'."
    )
    STREAM_NAME_INVALID = "stream.name_invalid", InvalidInput, (
        "Not a valid stream name: use 1-255 letters, digits, '-' or '_'."
    )
    STREAM_NAME_MISMATCH = "stream.name_mismatch", InvalidInput, (
        "The name in the body differs from the one in the path: make them equal, or leave "
        "the body's out."
    )
    STREAM_CONFIG_INVALID = "stream.config_invalid", InvalidInput, (
        "JetStream refused the stream configuration: `nats.description` says why."
    )
    STREAM_CREATE_FAILED = "stream.create_failed", InvalidInput, (
        "JetStream could not create the stream from this configuration: `nats.description` "
        "says why."
    )
    STREAM_LIMITS_INVALID = "stream.limits_invalid", InvalidInput, (
        "The stream's limits (max_msgs, max_bytes, max_age...) are not valid: fix them."
    )
    STREAM_UPDATE_INVALID = "stream.update_invalid", InvalidInput, (
        "NATS refused this change to the stream's configuration (what it says is in `nats`): "
        "change the request, or create a new stream instead."
    )
    STREAM_REPLICAS_UNSUPPORTED = "stream.replicas_unsupported", Conflict, (
        "More replicas than the NATS deployment can hold (a single server holds one)."
    )
    CONSUMER_NAME_INVALID = "consumer.name_invalid", InvalidInput, (
        "Not a valid consumer name: use 1-255 letters, digits, '-' or '_'."
    )
    CONSUMER_NAME_MISMATCH = "consumer.name_mismatch", InvalidInput, (
        "The name (or durable_name) in the body differs from the one in the path: make them "
        "equal, or leave the body's out."
    )
    CONSUMER_CONFIG_INVALID = "consumer.config_invalid", InvalidInput, (
        "JetStream refused the consumer configuration: `nats.description` says why."
    )
    CONSUMER_FILTER_INVALID = "consumer.filter_invalid", InvalidInput, (
        "The consumer's filter subjects are not valid for its stream: fix them."
    )
    CONSUMER_EXPLICIT_ACK_REQUIRED = "consumer.explicit_ack_required", InvalidInput, (
        "This kind of consumer (pull, priority groups, work queue) needs ack_policy "
        "'explicit'."
    )
    CONSUMER_WORKQUEUE_DELIVER_ALL = "consumer.workqueue_deliver_all", InvalidInput, (
        "A consumer of a work-queue stream must deliver all messages (deliver_policy 'all')."
    )
    CONSUMER_PRIORITY_POLICY_REQUIRED = "consumer.priority_policy_required", InvalidInput, (
        "priority_groups or priority_timeout need a priority_policy: overflow, "
        "pinned_client or prioritized."
    )
    CONSUMER_PRIORITY_GROUPS_REQUIRED = "consumer.priority_groups_required", InvalidInput, (
        "A priority_policy needs at least one priority group: give priority_groups."
    )
    CONSUMER_PRIORITY_REQUIRES_PULL = "consumer.priority_requires_pull", InvalidInput, (
        "Priority groups are for pull consumers: leave out deliver_subject."
    )
    CONSUMER_GROUP_NAME_INVALID = "consumer.group_name_invalid", InvalidInput, (
        "A priority group name is not valid (1-16 letters, digits, '-', '_', '/' or '=') or "
        "is given twice."
    )
    CONSUMER_GROUP_REQUIRED = "consumer.group_required", Conflict, (
        "The consumer has priority groups: give one of them as the pull's group."
    )
    CONSUMER_GROUP_OPTIONS = "consumer.group_options", InvalidInput, (
        "min_pending, min_ack_pending, priority and Nats-Pin-Id belong to a priority group: "
        "give the group too."
    )
    CONSUMER_GROUP_INVALID = "consumer.group_invalid", Conflict, (
        "The group is not one of the consumer's priority_groups: use one of them."
    )
    CONSUMER_NOT_OVERFLOW = "consumer.not_overflow", Conflict, (
        "min_pending and min_ack_pending need a consumer with the overflow priority policy."
    )
    CONSUMER_NOT_PINNED_CLIENT = "consumer.not_pinned_client", Conflict, (
        "A Nats-Pin-Id needs a consumer with the pinned_client priority policy."
    )
    CONSUMER_PRIORITY_INVALID = "consumer.priority_invalid", InvalidInput, (
        "The pull's priority must be from 0 to 9."
    )
    CONSUMER_PIN_ID_INVALID = "consumer.pin_id_invalid", InvalidInput, (
        "Not a pin id the gateway handed out: send back exactly the one it returned."
    )
    CONSUMER_FETCH_INVALID = "consumer.fetch_invalid", InvalidInput, (
        "The fetch asks for too much, or for both max_messages and max_bytes: give one, "
        "within the gateway's limits."
    )
    CONSUMER_CONSUME_INVALID = "consumer.consume_invalid", InvalidInput, (
        "The consume's buffer or thresholds are not valid (both max_messages and max_bytes, "
        "over the limits, a threshold above its maximum): fix them."
    )
    CONSUMER_EXPIRES_INVALID = "consumer.expires_invalid", InvalidInput, (
        "expires is outside the range the gateway allows (JSGW_MAX_FETCH_EXPIRES)."
    )
    CONSUMER_HEARTBEAT_INVALID = "consumer.heartbeat_invalid", InvalidInput, (
        "idle_heartbeat must be from 0.5s to 30s and at most half of expires; a consume "
        "always uses one."
    )
    CONSUMER_MAX_BATCH_EXCEEDED = "consumer.max_batch_exceeded", Conflict, (
        "More messages than the consumer's max_batch allows in one pull: ask for fewer."
    )
    CONSUMER_MAX_EXPIRES_EXCEEDED = "consumer.max_expires_exceeded", Conflict, (
        "expires is above the consumer's max_expires: ask for a shorter wait."
    )
    CONSUMER_MAX_BYTES_EXCEEDED = "consumer.max_bytes_exceeded", Conflict, (
        "max_bytes is above the consumer's max_bytes: ask for fewer bytes."
    )
    CONSUMER_MESSAGE_TOO_LARGE = "consumer.message_too_large", Conflict, (
        "The next message is larger than the consume's max_bytes, so it can never be "
        "delivered: consume with a larger max_bytes, or by max_messages."
    )
    CONSUMER_PULL_INVALID = "consumer.pull_invalid", InvalidInput, (
        "The server refused the pull request as malformed: `nats.description` says why."
    )
    ACK_INVALID = "ack.invalid", InvalidInput, (
        "An ack's options do not fit its kind (delay is for nak, reason for term) or contain "
        "control characters."
    )
    ACK_TOKEN_INVALID = "ack.token_invalid", InvalidInput, (
        "Not an ack token issued by this gateway (malformed or forged): send back the token "
        "exactly as received."
    )
    PUBLISH_TTL_INVALID = "publish.ttl_invalid", InvalidInput, (
        "The message's Nats-TTL is not valid: a duration of at least one second, or 'never'."
    )
    CONSUMER_PAUSE_INVALID = "consumer.pause_invalid", InvalidInput, (
        "The pause's `until` is not a time in the future (RFC 3339) or a duration above 0: "
        "fix it; resume with .../resume."
    )
    COUNTER_INCREMENT_INVALID = "counter.increment_invalid", InvalidInput, (
        "The increment is not a whole number: a JSON integer or a decimal string with an "
        "optional sign, of at most 100 digits (no fraction, exponent or boolean)."
    )
    PUBLISH_TTL_DISABLED = "publish.ttl_disabled", Conflict, (
        "The stream does not take per-message TTLs: set allow_msg_ttl on it first."
    )
    PUBLISH_BATCH_INVALID = "publish.batch_invalid", InvalidInput, (
        "The atomic batch uses a header as atomic batches may not (Nats-Expected-Last-Msg-Id; "
        "Nats-Expected-Last-Sequence past the first message; a Nats-Msg-Id twice; "
        "Nats-Expected-Last-Subject-Sequence on a subject an earlier message writes): "
        "`detail` says which message; nothing was sent."
    )
    SCHEDULE_INVALID = "schedule.invalid", InvalidInput, (
        "A message schedule header (Nats-Schedule, Nats-Schedule-Target, -Source, -TTL, "
        "-Time-Zone, -Rollup) is malformed or does not fit the others (the target and source "
        "are literal subjects other than the schedule's own): not stored."
    )
    KV_BUCKET_INVALID = "kv.bucket_invalid", InvalidInput, (
        "Not a valid bucket name: use 1-252 letters, digits, '-' or '_'."
    )
    KV_KEY_INVALID = "kv.key_invalid", InvalidInput, (
        "Not a valid key: letters, digits and -/_=. only, no empty token, no leading or "
        "trailing '.'."
    )
    KV_KEY_RESERVED = "kv.key_reserved", InvalidInput, (
        "Keys starting with '_kv' are reserved: choose another key."
    )
    KV_KEY_FILTER_INVALID = "kv.key_filter_invalid", InvalidInput, (
        "Not a valid key filter: key tokens, '*' or '>' as whole tokens, '>' last."
    )
    KV_PRECONDITION_INVALID = "kv.precondition_invalid", InvalidInput, (
        "The If-Match / If-None-Match headers do not fit the request: give one of them, and "
        "If-None-Match only as '*' on a write."
    )
    KV_REVISION_INVALID = "kv.revision_invalid", InvalidInput, (
        "If-Match is not one revision as an entity tag (like \"12\") or '*'."
    )
    KV_TTL_INVALID = "kv.ttl_invalid", InvalidInput, (
        "The ttl is not a valid duration: at least one second."
    )
    KV_TTL_NOT_ALLOWED = "kv.ttl_not_allowed", InvalidInput, (
        "A per-key ttl is set when creating a key (If-None-Match: *) or purging it, not on a "
        "plain put or delete (ADR-48)."
    )
    KV_TTL_DISABLED = "kv.ttl_disabled", Conflict, (
        "The bucket takes no per-key ttl: set limit_marker_ttl on it first (ADR-48)."
    )
    KV_WATCH_INVALID = "kv.watch_invalid", InvalidInput, (
        "The watch's options exclude each other or are out of range: fix them."
    )
    KV_LAST_EVENT_ID_INVALID = "kv.last_event_id_invalid", InvalidInput, (
        "Last-Event-ID is not a revision (a whole number): send back an event id received."
    )
    KV_CURSOR_INVALID = "kv.cursor_invalid", InvalidInput, (
        "The cursor is not a next_cursor returned by this listing: start again without one."
    )
    DIRECT_BAD_REQUEST = "direct.bad_request", InvalidInput, (
        "The server refused the Direct Get request: `detail` says why."
    )
    JETSTREAM_BAD_REQUEST = "jetstream.bad_request", InvalidInput, (
        "JetStream refused the request (with its own 4xx status, 400 by default): "
        "`nats.description` says why."
    )
    JETSTREAM_INVALID_JSON = "jetstream.invalid_json", InvalidInput, (
        "JetStream could not read the request the gateway built from yours: check the "
        "configuration's fields."
    )
    SUBSCRIPTION_NAME_INVALID = "subscription.name_invalid", InvalidInput, (
        "Not a valid subscription name: use 1-255 letters, digits, '-' or '_'."
    )
    SUBSCRIPTION_ENDPOINT_NOT_ALLOWED = "subscription.endpoint_not_allowed", InvalidInput, (
        "The subscription's endpoint is not an absolute http(s) URL under a prefix of "
        "JSGW_PUSH_ALLOWED_URLS (same scheme, host and port, the path on a segment boundary; "
        "no user information, no dot segments): nothing was stored. Use an allowed URL, or "
        "ask the operator to allow it."
    )
    SUBSCRIPTION_INVALID = "subscription.invalid", InvalidInput, (
        "The subscription cannot be delivered as given (its consumer_config does not ack "
        "explicitly, or contradicts what an ordered subscription needs): `detail` says what."
    )
    OBJ_BUCKET_INVALID = "obj.bucket_invalid", InvalidInput, (
        "Not a valid object bucket name: use 1-251 letters, digits, '-' or '_' (the stream "
        "OBJ_<bucket> has at most 255 characters)."
    )
    OBJ_NAME_INVALID = "obj.name_invalid", InvalidInput, (
        "Not a valid object name: 1 to 512 characters without control characters."
    )
    OBJ_LAST_EVENT_ID_INVALID = "obj.last_event_id_invalid", InvalidInput, (
        "Last-Event-ID of an object watch is the sequence of an event it sent (digits)."
    )
    OBJ_PRECONDITION_INVALID = "obj.precondition_invalid", InvalidInput, (
        "The If-Match / If-None-Match headers of an upload do not fit: If-Match takes one "
        'entity tag ("SHA-256=..."), If-None-Match only *, and not both.'
    )
    # -- 401, 403 --------------------------------------------------------------------------
    AUTH_REQUIRED = "auth.required", Unauthorized, (
        "No valid bearer token: send `Authorization: Bearer <token>`."
    )
    AUTH_FORBIDDEN = "auth.forbidden", Forbidden, (
        "The token is valid but may not do this (its grants do not cover the route, stream, "
        "bucket or prefix)."
    )
    ACK_TOKEN_FOREIGN = "ack.token_foreign", Forbidden, (
        "The ack token belongs to another stream or consumer: ack it through that one."
    )
    # -- 404 -------------------------------------------------------------------------------
    ROUTE_NOT_FOUND = "route.not_found", NotFound, (
        "No route has this path: check the URL against the API reference."
    )
    STREAM_NOT_FOUND = "stream.not_found", NotFound, (
        "The stream does not exist: check its name, or create it."
    )
    STREAM_DELETED = "stream.deleted", NotFound, (
        "The stream was deleted (or re-created) while it was being read: the reading ends."
    )
    STREAM_NO_MATCH = "stream.no_match", NotFound, (
        "No stream captures the subject: the message was not stored; create a stream whose "
        "subjects cover it."
    )
    CONSUMER_NOT_FOUND = "consumer.not_found", NotFound, (
        "The consumer does not exist: check its name, or create it."
    )
    CONSUMER_DELETED = "consumer.deleted", NotFound, (
        "The consumer was deleted while it was being pulled from: the pull ends."
    )
    COUNTER_NOT_FOUND = "counter.not_found", NotFound, (
        "The counter was never incremented (the subject has no message in the stream)."
    )
    MESSAGE_NOT_FOUND = "message.not_found", NotFound, (
        "No message matches the request (that sequence or subject has none, or it was "
        "deleted)."
    )
    KV_BUCKET_NOT_FOUND = "kv.bucket_not_found", NotFound, (
        "The bucket does not exist: check its name, or create it."
    )
    KV_BUCKET_DELETED = "kv.bucket_deleted", NotFound, (
        "The bucket was deleted while it was being watched: the watch ends."
    )
    KV_MIRROR_NOT_FOUND = "kv.mirror_not_found", NotFound, (
        "The bucket has no mirror of this name (no stream of the name, or one that does not "
        "mirror this bucket)."
    )
    KV_KEY_NOT_FOUND = "kv.key_not_found", NotFound, (
        "The key has no value (never written, deleted or purged; `operation` says which)."
    )
    JETSTREAM_NOT_FOUND = "jetstream.not_found", NotFound, (
        "JetStream answered 404 with an error the gateway has no better code for: "
        "`nats.description` says what is missing."
    )
    SUBSCRIPTION_NOT_FOUND = "subscription.not_found", NotFound, (
        "No push subscription of this name: check the name, or create it with PUT."
    )
    OBJ_BUCKET_NOT_FOUND = "obj.bucket_not_found", NotFound, (
        "The object bucket does not exist: check its name, or create it."
    )
    OBJ_NOT_FOUND = "obj.not_found", NotFound, (
        "The bucket has no object of this name (never stored, or deleted), or a link points "
        "to one that is gone."
    )
    # -- 405, 406 --------------------------------------------------------------------------
    ROUTE_METHOD_NOT_ALLOWED = "route.method_not_allowed", MethodNotAllowed, (
        "The route exists but not with this method: the Allow header lists those it takes."
    )
    DIRECT_ARROW_UNAVAILABLE = "direct.arrow_unavailable", NotAcceptable, (
        "Arrow was asked for alone and this gateway has no pyarrow: accept "
        "application/x-ndjson as well."
    )
    # -- 409 -------------------------------------------------------------------------------
    SUBSCRIPTION_DECLARED_IN_FILE = "subscription.declared_in_file", Conflict, (
        "The subscription is declared in the gateway's JSGW_SUBSCRIPTIONS file: it is changed "
        "there (and the gateway restarted), not through the API."
    )
    SUBSCRIPTION_CONSUMER_MISMATCH = "subscription.consumer_mismatch", Conflict, (
        "The consumer exists and cannot serve this subscription: a push consumer, acks that "
        "are not explicit, or (ordered) no pinned_client priority group of the subscription's "
        "group with max_ack_pending 1. Nothing was stored: change the consumer, or name another."
    )
    STREAM_EXISTS = "stream.exists", Conflict, (
        "A stream with this name exists with a different configuration."
    )
    STREAM_SUBJECT_OVERLAP = "stream.subject_overlap", Conflict, (
        "The stream's subjects overlap another stream's: make them disjoint."
    )
    STREAM_LIMIT_REACHED = "stream.limit_reached", Conflict, (
        "The account has as many streams as it may: delete one, or raise the limit."
    )
    STREAM_SEALED = "stream.sealed", Conflict, (
        "The stream is sealed: its messages cannot be deleted or purged."
    )
    STREAM_OPERATION_DENIED = "stream.operation_denied", Conflict, (
        "The stream's configuration forbids this: `deny_purge` forbids purging it, "
        "`deny_delete` deleting a message from it."
    )
    CONSUMER_EXISTS = "consumer.exists", Conflict, (
        "A consumer with this name exists with a different configuration."
    )
    CONSUMER_NOT_UPDATABLE = "consumer.not_updatable", Conflict, (
        "This change to the consumer's configuration is not allowed (e.g. its deliver "
        "policy): delete and re-create it."
    )
    STREAM_NOT_UPDATABLE = "stream.not_updatable", Conflict, (
        "This change to the stream's (or the bucket's) configuration is not allowed: its "
        "storage, counters and persist mode stay as made, its retention changes only between "
        "limits and interest, and deny_delete, deny_purge, allow_msg_ttl, "
        "allow_msg_schedules and sealed stay on once on. Delete and re-create it."
    )
    CONSUMER_LIMIT_REACHED = "consumer.limit_reached", Conflict, (
        "The stream has as many consumers as it may: delete one, or raise max_consumers."
    )
    CONSUMER_WORKQUEUE_OVERLAP = "consumer.workqueue_overlap", Conflict, (
        "On a work-queue stream, consumers' filters may not overlap: make them disjoint."
    )
    CONSUMER_PUSH_BASED = "consumer.push_based", Conflict, (
        "A push consumer cannot be pulled from: use a pull consumer."
    )
    COUNTER_NOT_ALLOWED = "counter.not_allowed", Conflict, (
        "The stream does not count: set allow_msg_counter on it (at creation) first."
    )
    COUNTER_INCREMENT_REQUIRED = "counter.increment_required", Conflict, (
        "The stream is a counter stream (allow_msg_counter): its messages are increments; "
        "send them with POST /v1/counters/{stream}/{subject}."
    )
    COUNTER_BROKEN = "counter.broken", Conflict, (
        "The subject's last message is not a counter value the server can add to."
    )
    COUNTER_WRONG_STREAM = "counter.wrong_stream", Conflict, (
        "The subject is not captured by the stream in the path (another stream, or none, "
        "stores it): nothing was sent; use the stream whose subjects cover it."
    )
    DIRECT_NOT_ALLOWED = "direct.not_allowed", Conflict, (
        "The stream does not allow Direct Get (allow_direct is false): enable it, or read "
        "with consistency=leader."
    )
    STREAM_RANGE_WORKQUEUE = "stream.range_workqueue", Conflict, (
        "The stream is a work queue: a range read needs a consumer of its own, which a work "
        "queue does not allow beside the consumer that takes its messages. Read it with Direct "
        "Get (allow_direct), or through its consumer."
    )
    KV_NOT_A_BUCKET = "kv.not_a_bucket", Conflict, (
        "A stream of the bucket's name exists but is not a KV bucket."
    )
    PUBLISH_ATOMIC_NOT_ALLOWED = "publish.atomic_not_allowed", Conflict, (
        "The stream does not take atomic batches: set allow_atomic on it first. Nothing was "
        "stored."
    )
    PUBLISH_BATCH_STREAMS = "publish.batch_streams", Conflict, (
        "The messages of an atomic batch go to more than one stream (as the streams' "
        "subjects are now): an atomic batch is stored in one stream; split it. Nothing was "
        "sent."
    )
    PUBLISH_BATCH_DUPLICATE = "publish.batch_duplicate", Conflict, (
        "A message of the atomic batch has a Nats-Msg-Id the stream already holds within its "
        "duplicate window: nothing of the batch was stored (a retried batch was stored the "
        "first time)."
    )
    SCHEDULE_TARGET_OUTSIDE = "schedule.target_outside", Conflict, (
        "The schedule's Nats-Schedule-Target (or Nats-Schedule-Source) is not a subject of "
        "the stream that stores the schedule: a schedule publishes within its own stream. "
        "Not stored."
    )
    SCHEDULE_NOT_ALLOWED = "schedule.not_allowed", Conflict, (
        "The stream does not take message schedules: set allow_msg_schedules on it first. "
        "Not stored."
    )
    KV_LIMIT_MARKERS_LOCKED = "kv.limit_markers_locked", Conflict, (
        "Limit markers cannot be turned off once on (ADR-48): give limit_marker_ttl again."
    )
    KV_READ_ONLY = "kv.read_only", Conflict, (
        "The bucket is a read-only aggregate (ADR-8): its values come from its origins only. "
        "Write to an origin, or make the aggregate writable."
    )
    KV_NOT_AGGREGATE = "kv.not_aggregate", Conflict, (
        "The bucket is not an aggregate: origins are added to an aggregate only (create it "
        "with `aggregate`)."
    )
    KV_ORIGIN_EXISTS = "kv.origin_exists", Conflict, (
        "The aggregate already sources this origin (the same stream and external API): "
        "nothing was changed."
    )
    KV_DIRECT_REQUIRED = "kv.direct_required", Conflict, (
        "A mirror answers Direct Gets for its origin bucket, which needs allow_direct on the "
        "bucket (ADR-8): update the bucket through the gateway (which sets it) first."
    )
    KV_MIRROR_OUTLIVES_BUCKET = "kv.mirror_outlives_bucket", Conflict, (
        "A mirror of every key answers the bucket's reads, so it may not keep values longer "
        "than the bucket (a ttl longer than the bucket's, or none when the bucket has one): "
        "leave ttl out to take the bucket's, or mirror some keys only."
    )
    KV_MIRROR_KEYS_LOCAL = "kv.mirror_keys_local", Conflict, (
        "nats-server makes a mirror of a bucket on the same JetStream answer the bucket's "
        "Direct Gets, and a mirror of some keys would answer 'not found' for the others: "
        "mirror every key, or give keys for an external bucket only."
    )
    KV_NOT_A_MIRROR = "kv.not_a_mirror", Conflict, (
        "A stream of the mirror's name exists and is not a mirror of this bucket: it is left "
        "alone; choose another name."
    )
    OBJ_NOT_A_BUCKET = "obj.not_a_bucket", Conflict, (
        "A stream OBJ_<bucket> exists but is not an object bucket (its subjects are not "
        "$O.<bucket>.C.> and $O.<bucket>.M.>)."
    )
    OBJ_LINK_TO_BUCKET = "obj.link_to_bucket", Conflict, (
        "The object is a link to a whole bucket (ADR-20), which has no content to download."
    )
    # -- 412 -------------------------------------------------------------------------------
    PUBLISH_WRONG_STREAM = "publish.wrong_stream", PreconditionFailed, (
        "The subject is not in the stream named by Nats-Expected-Stream: not stored."
    )
    PUBLISH_WRONG_LAST_MSG_ID = "publish.wrong_last_msg_id", PreconditionFailed, (
        "The stream's last Nats-Msg-Id is not the expected one: not stored; read and retry."
    )
    PUBLISH_WRONG_LAST_SEQUENCE = "publish.wrong_last_sequence", PreconditionFailed, (
        "The stream's (or subject's) last sequence is not the expected one: not stored; "
        "read and retry."
    )
    KV_KEY_EXISTS = "kv.key_exists", PreconditionFailed, (
        "If-None-Match: * but the key has a value (`revision` says which): not written."
    )
    KV_REVISION_MISMATCH = "kv.revision_mismatch", PreconditionFailed, (
        "The key is not at the revision If-Match expected (`revision` says where it is): "
        "not written; read and retry."
    )
    OBJ_EXISTS = "obj.exists", PreconditionFailed, (
        "If-None-Match: * but the object exists: not stored (nothing of the upload is kept)."
    )
    OBJ_CHANGED = "obj.changed", PreconditionFailed, (
        "The object is not the version If-Match named (or changed during the upload): not "
        "stored (nothing of the upload is kept); read its ETag and retry."
    )
    # -- 413 -------------------------------------------------------------------------------
    REQUEST_TOO_LARGE = "request.too_large", PayloadTooLarge, (
        "The request body is over the gateway's limit (JSGW_MAX_BODY or the server's "
        "max_payload): send less."
    )
    REQUEST_JSON_TOO_LARGE = "request.json_too_large", PayloadTooLarge, (
        "The JSON request body is over JSGW_MAX_JSON_BODY (JSON is decoded and validated "
        "whole): send less, e.g. a batch in several requests; the connection is closed."
    )
    MESSAGE_TOO_LARGE = "message.too_large", PayloadTooLarge, (
        "The message is over the server's max_payload or the stream's max_msg_size: not "
        "stored."
    )
    PUBLISH_BATCH_TOO_LARGE = "publish.batch_too_large", PayloadTooLarge, (
        "More messages in one batch than JSGW_MAX_PUBLISH_BATCH, or in an atomic batch than "
        "the NATS server takes (1,000 unless its batch limits say fewer): split it."
    )
    ACK_BATCH_TOO_LARGE = "ack.batch_too_large", PayloadTooLarge, (
        "More acks in one request than JSGW_MAX_FETCH_MESSAGES: split it."
    )
    KV_VALUE_TOO_LARGE = "kv.value_too_large", PayloadTooLarge, (
        "The value, with the headers the write carries (a delete marker's, a condition's: "
        "the server counts them too), is over the bucket's max_value_size or the server's "
        "max_payload: not written."
    )
    STREAM_TOO_MANY_SUBJECTS = "stream.too_many_subjects", PayloadTooLarge, (
        "The request matches more subjects than the server answers for at once: narrow it."
    )
    DIRECT_TOO_MANY_SUBJECTS = "direct.too_many_subjects", PayloadTooLarge, (
        "More subjects (keys) than one multi-read takes, or filters matching more than 1024: "
        "narrow them or split the request."
    )
    OBJ_RANGE_NOT_SATISFIABLE = "obj.range_not_satisfiable", RangeNotSatisfiable, (
        "The Range asks for bytes past the object's end (Content-Range says its size)."
    )
    OBJ_BUCKET_FULL = "obj.bucket_full", PayloadTooLarge, (
        "The object does not fit in what the bucket's max_bytes leaves: nothing of the upload "
        "is kept; delete objects or raise max_bytes."
    )
    # -- 423, 429, 431 ---------------------------------------------------------------------
    CONSUMER_PIN_MISMATCH = "consumer.pin_mismatch", Locked, (
        "The pin id is no longer the group's pinned client: drop it and pull without a "
        "Nats-Pin-Id."
    )
    RATE_LIMITED = "rate_limited", TooManyRequests, (
        "Too many requests for this token: wait for Retry-After."
    )
    SSE_TOO_MANY_STREAMS = "sse.too_many_streams", TooManyRequests, (
        "Too many open event streams (for this token, this client address or in all): close "
        "one or retry after Retry-After."
    )
    KV_TOO_MANY_WATCHES = "kv.too_many_watches", TooManyRequests, (
        "The gateway serves as many watches as it may: retry after Retry-After."
    )
    KV_WATCH_TOO_SLOW = "kv.watch_too_slow", TooManyRequests, (
        "The client fell too far behind the watch: it ends; reconnect with Last-Event-ID to "
        "resume."
    )
    NATS_SLOW_CONSUMER = "nats.slow_consumer", TooManyRequests, (
        "The client read a core subscription's messages slower than they came, and the "
        "messages queued for it passed JSGW_SSE_QUEUE_SIZE or JSGW_NATS_SUBSCRIBE_QUEUE_BYTES: "
        "the stream ends (the messages it missed are gone: core NATS keeps none); reconnect."
    )
    PUBLISH_BATCH_BUSY = "publish.batch_busy", TooManyRequests, (
        "The stream (or the NATS server) has as many atomic batches in flight as it takes: "
        "nothing was stored; retry shortly."
    )
    CONSUMER_MAX_WAITING_EXCEEDED = "consumer.max_waiting_exceeded", TooManyRequests, (
        "Too many pull requests are waiting on this consumer (max_waiting): retry shortly."
    )
    HEADER_TOO_LARGE = "header.too_large", HeadTooLarge, (
        "The request head (request line and headers) is over JSGW_MAX_HEADER_BYTES: the "
        "connection was answered and closed; send smaller headers."
    )
    HEADER_TOO_MANY = "header.too_many", HeadTooLarge, (
        "The request has more header fields than JSGW_MAX_HEADER_FIELDS: the connection was "
        "answered and closed; send fewer."
    )
    # -- 500, 501, 502 ---------------------------------------------------------------------
    GATEWAY_INTERNAL = "gateway.internal", GatewayError, (
        "A bug in the gateway: the request's X-Request-ID finds it in the logs; report it."
    )
    HTTP_ERROR = "http.error", GatewayError, (
        "An HTTP-level refusal without a more specific code, with its own status: `detail` "
        "says why."
    )
    DIRECT_BATCH_UNSUPPORTED = "direct.batch_unsupported", Unsupported, (
        "The NATS server does not support batched Direct Get: nats-server 2.11 or later is "
        "needed."
    )
    NATS_FEATURE_UNSUPPORTED = "nats.feature_unsupported", Unsupported, (
        "The NATS server is of a release older than a feature the request needs: `detail` "
        "names the feature and the release that has it. Nothing was sent to the server."
    )
    JETSTREAM_ERROR = "jetstream.error", UpstreamError, (
        "JetStream failed with an error the gateway has no better code for: "
        "`nats.description` says what; retry, or ask the NATS operator."
    )
    JETSTREAM_BAD_RESPONSE = "jetstream.bad_response", UpstreamError, (
        "JetStream sent a reply the gateway cannot read: retry; if it persists, check the "
        "server's version."
    )
    DIRECT_GAP = "direct.gap", UpstreamError, (
        "A Direct Get reply was lost in the middle of a batch: retry the request."
    )
    DIRECT_ERROR = "direct.error", UpstreamError, (
        "The server answered a Direct Get with an unexpected status: `detail` says which."
    )
    CONSUMER_BAD_DELIVERY = "consumer.bad_delivery", UpstreamError, (
        "The server delivered a message without a valid ack subject."
    )
    CONSUMER_PULL_FAILED = "consumer.pull_failed", UpstreamError, (
        "The server ended the pull with an unexpected status: `nats.description` says which."
    )
    OBJ_META_INVALID = "obj.meta_invalid", UpstreamError, (
        "The object's meta message in the stream is not ADR-20 object info."
    )
    OBJ_CORRUPT = "obj.corrupt", UpstreamError, (
        "The object's chunks do not match its size or digest: the download is cut off "
        "rather than served corrupt."
    )
    # -- 503 -------------------------------------------------------------------------------
    NATS_UNAVAILABLE = "nats.unavailable", Unavailable, (
        "The gateway has no NATS connection up: nothing was sent; retry after Retry-After."
    )
    NATS_NO_RESPONDERS = "nats.no_responders", NoResponders, (
        "Nobody listens on the subject the gateway sent to: retry shortly."
    )
    HTTP_CONNECTION_LIMIT = "http.connection_limit", Unavailable, (
        "The gateway worker holds as many connections as JSGW_MAX_CONNECTIONS allows: the "
        "connection was answered and closed; retry after Retry-After (or on another replica)."
    )
    JETSTREAM_UNAVAILABLE = "jetstream.unavailable", Unavailable, (
        "JetStream did not take the request (not enabled for the account, wrong domain, no "
        "meta leader): retry shortly."
    )
    JETSTREAM_NOT_ENABLED = "jetstream.not_enabled", Unavailable, (
        "JetStream is not enabled on the server or for the account."
    )
    JETSTREAM_INSUFFICIENT_RESOURCES = "jetstream.insufficient_resources", Unavailable, (
        "The NATS servers lack the resources (storage, memory, peers) for the request."
    )
    JETSTREAM_MEMORY_EXCEEDED = "jetstream.memory_exceeded", Conflict, (
        "The configuration reserves more memory than JetStream has left (max_bytes of a "
        "memory stream, or the account's limits): ask for less, free some, or raise the limit."
    )
    JETSTREAM_STORAGE_EXCEEDED = "jetstream.storage_exceeded", Conflict, (
        "The configuration reserves more storage than JetStream has left (max_bytes of a "
        "file stream, or the account's limits): ask for less, free some, or raise the limit."
    )
    STREAM_OFFLINE = "stream.offline", Unavailable, (
        "The stream is offline (its servers are down or it is being recovered): retry later."
    )
    PUBLISH_BATCH_INCOMPLETE = "publish.batch_incomplete", Unavailable, (
        "The NATS server did not receive the whole atomic batch (a message lost on the way, "
        "or the batch abandoned): nothing was stored; retry."
    )
    STREAM_UNAVAILABLE = "stream.unavailable", Unavailable, (
        "No stream answered the publish (its stream has no leader right now, e.g. during an "
        "election): not stored; retry shortly."
    )
    CONSUMER_OFFLINE = "consumer.offline", Unavailable, (
        "The consumer is offline (its servers are down or it is being recovered): retry "
        "later."
    )
    DIRECT_UNAVAILABLE = "direct.unavailable", Unavailable, (
        "No server answered the Direct Get: retry shortly."
    )
    GATEWAY_SHUTDOWN = "gateway.shutdown", Unavailable, (
        "The gateway is shutting down: reconnect (to another instance)."
    )
    # -- 504 -------------------------------------------------------------------------------
    NATS_TIMEOUT = "nats.timeout", Timeout, (
        "NATS did not answer in time: a read can be retried."
    )
    NATS_OUTCOME_UNKNOWN = "nats.outcome_unknown", Timeout, (
        "A write was not confirmed in time: it may or may not be stored. Retry with the same "
        "Nats-Msg-Id (or read the key) to find out."
    )
    # fmt: on


_OWNERS: dict[ErrorCode, type[GatewayError]] = {}
"""The codes that have a class of their own (filled by ``GatewayError.__init_subclass__``)."""


class WarningCode(StrEnum):
    """The ``code`` of a ``warning`` event on a consume stream: the stream goes on.

    A warning may also carry the :class:`ErrorCode` of a pull that was refused."""

    meaning: str

    def __new__(cls, value: str, meaning: str) -> WarningCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    # fmt: off
    NATS_DISCONNECTED = "nats.disconnected", (
        "The gateway lost its NATS connection: pulling resumes when it is back."
    )
    CONSUMER_RECOVERING = "consumer.recovering", (
        "After a reconnect the gateway could not yet check the consumer: it keeps trying."
    )
    CONSUMER_HEARTBEAT_MISSED = "consumer.heartbeat_missed", (
        "The server sent neither a message nor a heartbeat in time: the gateway pulls again."
    )
    # fmt: on


# -- the classes of the codes that are caught ---------------------------------------------


class TtlDisabled(Conflict):
    own_code = ErrorCode.PUBLISH_TTL_DISABLED


class StreamNotFound(NotFound):
    own_code = ErrorCode.STREAM_NOT_FOUND


class StreamDeleted(NotFound):
    own_code = ErrorCode.STREAM_DELETED


class StreamNoMatch(NotFound):
    own_code = ErrorCode.STREAM_NO_MATCH


class ConsumerNotFound(NotFound):
    own_code = ErrorCode.CONSUMER_NOT_FOUND


class StreamUnavailable(Unavailable):
    """A stream is there but nobody took a write (no leader): sent again before it is answered."""

    own_code = ErrorCode.STREAM_UNAVAILABLE


class MessageNotFound(NotFound):
    own_code = ErrorCode.MESSAGE_NOT_FOUND


class StreamExists(Conflict):
    own_code = ErrorCode.STREAM_EXISTS


class ConsumerExists(Conflict):
    own_code = ErrorCode.CONSUMER_EXISTS


class DirectNotAllowed(Conflict):
    own_code = ErrorCode.DIRECT_NOT_ALLOWED


class BatchUnsupported(Unsupported):
    """The server has no batched Direct Get (nats-server 2.10): KV reads fall back."""

    own_code = ErrorCode.DIRECT_BATCH_UNSUPPORTED


class FeatureUnsupported(Unsupported):
    """The connected server predates a feature (``app.nats.features``)."""

    own_code = ErrorCode.NATS_FEATURE_UNSUPPORTED


class OutcomeUnknown(Timeout):
    """A write timed out: it may or may not be stored. Retry with the same Nats-Msg-Id."""

    own_code = ErrorCode.NATS_OUTCOME_UNKNOWN


def for_code(code: ErrorCode, detail: str = "", **kwargs: Any) -> GatewayError:
    """The error for ``code``, of the class that carries it (for codes chosen from a table)."""
    return code.error_class(code, detail, **kwargs)


# JetStream err_code -> stable code (which says the class). The list covers the errors that
# a client can cause or act on; others fall back on the HTTP-like ``code`` the server sent.
_JS_ERRORS: dict[int, ErrorCode] = {
    10003: ErrorCode.JETSTREAM_BAD_REQUEST,
    # The server reports these with code 500, but they describe the request's config.
    10049: ErrorCode.STREAM_CREATE_FAILED,
    10053: ErrorCode.STREAM_LIMITS_INVALID,
    10057: ErrorCode.MESSAGE_NOT_FOUND,  # delete of a sequence the store does not have
    10069: ErrorCode.STREAM_UPDATE_INVALID,
    10074: ErrorCode.STREAM_REPLICAS_UNSUPPORTED,
    10117: ErrorCode.STREAM_TOO_MANY_SUBJECTS,
    10118: ErrorCode.STREAM_OFFLINE,
    10119: ErrorCode.CONSUMER_OFFLINE,
    10194: ErrorCode.STREAM_OFFLINE,
    10195: ErrorCode.CONSUMER_OFFLINE,
    10008: ErrorCode.JETSTREAM_UNAVAILABLE,
    10012: ErrorCode.CONSUMER_NOT_UPDATABLE,  # e.g. "deliver policy can not be updated"
    10013: ErrorCode.CONSUMER_EXISTS,
    10014: ErrorCode.CONSUMER_NOT_FOUND,
    10023: ErrorCode.JETSTREAM_INSUFFICIENT_RESOURCES,
    10025: ErrorCode.JETSTREAM_INVALID_JSON,
    10026: ErrorCode.CONSUMER_LIMIT_REACHED,
    10027: ErrorCode.STREAM_LIMIT_REACHED,
    10028: ErrorCode.JETSTREAM_MEMORY_EXCEEDED,
    10037: ErrorCode.MESSAGE_NOT_FOUND,
    10039: ErrorCode.JETSTREAM_NOT_ENABLED,
    10043: ErrorCode.MESSAGE_NOT_FOUND,
    10047: ErrorCode.JETSTREAM_STORAGE_EXCEEDED,
    10052: ErrorCode.STREAM_CONFIG_INVALID,
    10054: ErrorCode.MESSAGE_TOO_LARGE,
    10056: ErrorCode.STREAM_NAME_MISMATCH,
    10058: ErrorCode.STREAM_EXISTS,
    10059: ErrorCode.STREAM_NOT_FOUND,
    10060: ErrorCode.PUBLISH_WRONG_STREAM,
    10065: ErrorCode.STREAM_SUBJECT_OVERLAP,
    10070: ErrorCode.PUBLISH_WRONG_LAST_MSG_ID,
    10071: ErrorCode.PUBLISH_WRONG_LAST_SEQUENCE,
    10076: ErrorCode.JETSTREAM_NOT_ENABLED,
    10084: ErrorCode.CONSUMER_EXPLICIT_ACK_REQUIRED,
    10093: ErrorCode.CONSUMER_FILTER_INVALID,
    10098: ErrorCode.CONSUMER_EXPLICIT_ACK_REQUIRED,
    10099: ErrorCode.CONSUMER_WORKQUEUE_OVERLAP,
    10100: ErrorCode.CONSUMER_WORKQUEUE_OVERLAP,
    10101: ErrorCode.CONSUMER_WORKQUEUE_DELIVER_ALL,
    10105: ErrorCode.CONSUMER_EXISTS,
    10109: ErrorCode.STREAM_SEALED,
    10116: ErrorCode.CONSUMER_CONFIG_INVALID,
    10148: ErrorCode.CONSUMER_EXISTS,
    10149: ErrorCode.CONSUMER_NOT_FOUND,
    10159: ErrorCode.CONSUMER_PRIORITY_GROUPS_REQUIRED,
    10160: ErrorCode.CONSUMER_GROUP_INVALID,
    10161: ErrorCode.CONSUMER_GROUP_NAME_INVALID,
    10162: ErrorCode.CONSUMER_GROUP_NAME_INVALID,
    10163: ErrorCode.JETSTREAM_UNAVAILABLE,
    10164: ErrorCode.PUBLISH_WRONG_LAST_SEQUENCE,
    # "duplicate message id is in process" (2.11+): a message with this Nats-Msg-Id is being
    # stored right now, so whether it will be is not known yet; retry with the same id.
    10158: ErrorCode.NATS_OUTCOME_UNKNOWN,
    10165: ErrorCode.PUBLISH_TTL_INVALID,
    10168: ErrorCode.COUNTER_NOT_ALLOWED,
    10169: ErrorCode.COUNTER_INCREMENT_REQUIRED,
    10170: ErrorCode.COUNTER_INCREMENT_REQUIRED,
    10171: ErrorCode.COUNTER_INCREMENT_INVALID,
    10172: ErrorCode.COUNTER_BROKEN,
    10166: ErrorCode.PUBLISH_TTL_DISABLED,
    10178: ErrorCode.CONSUMER_PRIORITY_REQUIRES_PULL,
    # Atomic batches (ADR-50). 10175, 10179 and 10200 (a missing sequence, a bad batch id, a
    # bad commit) are the gateway's to avoid: they stay jetstream.bad_request.
    10174: ErrorCode.PUBLISH_ATOMIC_NOT_ALLOWED,
    10176: ErrorCode.PUBLISH_BATCH_INCOMPLETE,
    10177: ErrorCode.PUBLISH_BATCH_INVALID,
    10199: ErrorCode.PUBLISH_BATCH_TOO_LARGE,
    10201: ErrorCode.PUBLISH_BATCH_DUPLICATE,
    10210: ErrorCode.PUBLISH_BATCH_BUSY,
    # Message schedules (ADR-51).
    10188: ErrorCode.SCHEDULE_NOT_ALLOWED,
    10189: ErrorCode.SCHEDULE_INVALID,
    # (the gateway checks the target's and source's form: what the server still refuses is
    # a subject outside the stream)
    10190: ErrorCode.SCHEDULE_TARGET_OUTSIDE,
    10191: ErrorCode.SCHEDULE_INVALID,
    10192: ErrorCode.SCHEDULE_INVALID,
    10203: ErrorCode.SCHEDULE_TARGET_OUTSIDE,
    10212: ErrorCode.SCHEDULE_INVALID,
    10223: ErrorCode.SCHEDULE_INVALID,
    10196: ErrorCode.CONSUMER_PRIORITY_POLICY_REQUIRED,
    10197: ErrorCode.CONSUMER_PRIORITY_POLICY_REQUIRED,
}


_JS_DESCRIPTIONS: dict[str, ErrorCode] = {
    "stream purge not permitted": ErrorCode.STREAM_OPERATION_DENIED,  # deny_purge (10110)
    "message delete not permitted": ErrorCode.STREAM_OPERATION_DENIED,  # deny_delete (10057)
}


def jetstream_err_codes(code: ErrorCode) -> list[int]:
    """The JetStream ``err_code`` values that map to ``code`` (for its documentation)."""
    return sorted(err_code for err_code, mapped in _JS_ERRORS.items() if mapped is code)


def from_jetstream(error: dict[str, Any]) -> GatewayError:
    """Turn the ``error`` object of a JetStream API response into a gateway error."""
    err_code = int(error.get("err_code") or 0)
    http_code = int(error.get("code") or 500)
    description = str(error.get("description") or "JetStream error")
    nats = {"code": http_code, "err_code": err_code, "description": description}
    # Codes that stand for several failures (10110 "stream purge failed", 10057 "message
    # delete failed"): what the stream's own config forbids is told by the description.
    mapped = _JS_DESCRIPTIONS.get(description) or _JS_ERRORS.get(err_code)
    if mapped is not None:
        return for_code(mapped, description, nats=nats)
    if http_code == 404:
        return NotFound(ErrorCode.JETSTREAM_NOT_FOUND, description, nats=nats)
    if http_code == 503:
        return Unavailable(ErrorCode.JETSTREAM_UNAVAILABLE, description, nats=nats)
    if 400 <= http_code < 500:
        return InvalidInput(
            ErrorCode.JETSTREAM_BAD_REQUEST, description, status=http_code, nats=nats
        )
    return UpstreamError(ErrorCode.JETSTREAM_ERROR, description, nats=nats)
