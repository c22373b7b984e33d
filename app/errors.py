"""The error taxonomy: domain errors, NATS/JetStream error mapping, RFC 9457 problem+json.

Services raise the classes below; nothing else in the gateway picks an HTTP status for an
error. JetStream API errors are mapped by their numeric ``err_code``, never by text.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

log = logging.getLogger("jsgw.errors")

PROBLEM_CONTENT_TYPE = "application/problem+json"


class GatewayError(Exception):
    """Base of every error the gateway answers with a problem+json document."""

    status: int = 500
    code: str = "gateway.error"
    title: str | None = None

    def __init__(
        self,
        code: str | None = None,
        detail: str = "",
        *,
        status: int | None = None,
        nats: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail or code or self.code)
        if code:
            self.code = code
        if status is not None:
            self.status = status
        self.detail = detail
        self.nats = nats
        self.headers = headers or {}
        self.extra = extra or {}

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"https://jsgw.dev/problems/{self.code}",
            "title": self.title or HTTPStatus(self.status).phrase,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if instance:
            body["instance"] = instance
        if self.nats:
            body["nats"] = self.nats
        body.update(self.extra)
        return body


class InvalidInput(GatewayError):
    status = 400
    code = "request.invalid"


class Unauthorized(GatewayError):
    status = 401
    code = "auth.required"


class Forbidden(GatewayError):
    status = 403
    code = "auth.forbidden"


class NotFound(GatewayError):
    status = 404
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    code = "conflict"


class PreconditionFailed(GatewayError):
    status = 412
    code = "precondition_failed"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "request.too_large"


class Locked(GatewayError):
    status = 423
    code = "locked"


class TooManyRequests(GatewayError):
    status = 429
    code = "rate_limited"


class UpstreamError(GatewayError):
    """JetStream answered with an error the gateway has no better mapping for."""

    status = 502
    code = "nats.error"


class Unavailable(GatewayError):
    status = 503
    code = "nats.unavailable"


class Timeout(GatewayError):
    status = 504
    code = "nats.timeout"


class OutcomeUnknown(Timeout):
    """A write timed out: it may or may not be stored. Retry with the same Nats-Msg-Id."""

    code = "nats.outcome_unknown"


# JetStream err_code -> (error class, stable code). The list covers the errors that a
# client can cause or act on; others fall back on the HTTP-like ``code`` the server sent.
_JS_ERRORS: dict[int, tuple[type[GatewayError], str]] = {
    10003: (InvalidInput, "jetstream.bad_request"),
    # The server reports these with code 500, but they describe the request's config.
    10049: (InvalidInput, "stream.create_failed"),
    10053: (InvalidInput, "stream.limits_invalid"),
    10057: (NotFound, "message.not_found"),  # delete of a sequence the store does not have
    10069: (InvalidInput, "stream.update_invalid"),
    10074: (InvalidInput, "stream.replicas_unsupported"),
    10117: (PayloadTooLarge, "stream.too_many_subjects"),
    10118: (Unavailable, "stream.offline"),
    10119: (Unavailable, "consumer.offline"),
    10194: (Unavailable, "stream.offline"),
    10195: (Unavailable, "consumer.offline"),
    10008: (Unavailable, "jetstream.unavailable"),
    10012: (Conflict, "consumer.not_updatable"),  # e.g. "deliver policy can not be updated"
    10013: (Conflict, "consumer.exists"),
    10014: (NotFound, "consumer.not_found"),
    10023: (Unavailable, "jetstream.insufficient_resources"),
    10025: (InvalidInput, "jetstream.invalid_json"),
    10026: (Conflict, "consumer.limit_reached"),
    10027: (Conflict, "stream.limit_reached"),
    10028: (Unavailable, "jetstream.memory_exceeded"),
    10037: (NotFound, "message.not_found"),
    10039: (Unavailable, "jetstream.not_enabled"),
    10043: (NotFound, "message.not_found"),
    10047: (Unavailable, "jetstream.storage_exceeded"),
    10052: (InvalidInput, "stream.config_invalid"),
    10054: (PayloadTooLarge, "message.too_large"),
    10056: (InvalidInput, "stream.name_mismatch"),
    10058: (Conflict, "stream.exists"),
    10059: (NotFound, "stream.not_found"),
    10060: (PreconditionFailed, "publish.wrong_stream"),
    10065: (Conflict, "stream.subject_overlap"),
    10070: (PreconditionFailed, "publish.wrong_last_msg_id"),
    10071: (PreconditionFailed, "publish.wrong_last_sequence"),
    10076: (Unavailable, "jetstream.not_enabled"),
    10084: (InvalidInput, "consumer.explicit_ack_required"),
    10093: (InvalidInput, "consumer.filter_invalid"),
    10098: (InvalidInput, "consumer.explicit_ack_required"),
    10099: (Conflict, "consumer.workqueue_overlap"),
    10100: (Conflict, "consumer.workqueue_overlap"),
    10101: (InvalidInput, "consumer.workqueue_deliver_all"),
    10105: (Conflict, "consumer.exists"),
    10109: (Conflict, "stream.sealed"),
    10116: (InvalidInput, "consumer.config_invalid"),
    10148: (Conflict, "consumer.exists"),
    10149: (NotFound, "consumer.not_found"),
    10159: (InvalidInput, "consumer.priority_groups_required"),
    10160: (InvalidInput, "consumer.group_invalid"),
    10161: (InvalidInput, "consumer.group_name_invalid"),
    10162: (InvalidInput, "consumer.group_name_invalid"),
    10163: (Unavailable, "jetstream.unavailable"),
    10164: (PreconditionFailed, "publish.wrong_last_sequence"),
    # "duplicate message id is in process" (2.11+): a message with this Nats-Msg-Id is being
    # stored right now, so whether it will be is not known yet; retry with the same id.
    10158: (OutcomeUnknown, "nats.outcome_unknown"),
    10165: (InvalidInput, "publish.ttl_invalid"),
    10166: (InvalidInput, "publish.ttl_disabled"),
    10178: (InvalidInput, "consumer.priority_requires_pull"),
    10196: (InvalidInput, "consumer.priority_policy_required"),
    10197: (InvalidInput, "consumer.priority_policy_required"),
}


def from_jetstream(error: dict[str, Any]) -> GatewayError:
    """Turn the ``error`` object of a JetStream API response into a gateway error."""
    err_code = int(error.get("err_code") or 0)
    http_code = int(error.get("code") or 500)
    description = str(error.get("description") or "JetStream error")
    nats = {"code": http_code, "err_code": err_code, "description": description}
    mapped = _JS_ERRORS.get(err_code)
    if mapped is not None:
        cls, code = mapped
        return cls(code, description, nats=nats)
    if http_code == 404:
        return NotFound("jetstream.not_found", description, nats=nats)
    if http_code == 503:
        return Unavailable("jetstream.unavailable", description, nats=nats)
    if 400 <= http_code < 500:
        return InvalidInput("jetstream.bad_request", description, status=http_code, nats=nats)
    return UpstreamError("jetstream.error", description, nats=nats)
