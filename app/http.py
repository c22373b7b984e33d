"""HTTP helpers shared by the routers: fast JSON responses, bounded body reads, OpenAPI docs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import Request
from pydantic import BeforeValidator
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from app import errors
from app.errors import PROBLEM_CONTENT_TYPE, ErrorCode


class JSON(JSONResponse):
    """JSON rendered by orjson (several times faster than the standard library)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)


class JSONBytes(Response):
    """JSON already encoded (the same headers as :class:`JSON`)."""

    media_type = "application/json"


def _plain_digits(value: object) -> object:
    # Lax integer parsing takes "+1", " 1", "1\n" and "1_0" (= 10): a DELETE of message
    # "1_0" would delete message 10. Sequences and revisions in URLs are digits, nothing else.
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number written with the digits 0-9 only")
    return value


PlainDigits = BeforeValidator(_plain_digits)
"""For sequence numbers in paths and queries; goes after ``Path()``/``Query()`` in the
``Annotated`` (before them, FastAPI would misplace their bounds in the OpenAPI schema)."""


def wants_json(headers: Headers) -> bool:
    """True when the client prefers JSON over the raw bytes (``Accept: application/json``)."""
    # (Headers.get is Mapping.get: a request without Accept, the common case, costs a
    # KeyError raised and caught.)
    for name, value in headers.raw:
        if name == b"accept":  # the first, as Headers.get reads; ASGI names are lower-case
            return b"application/json" in value
    return False


async def read_body(
    request: Request,
    limit: int,
    too_large: Callable[[int], errors.GatewayError] | None = None,
) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes
    (``too_large(limit)`` says which limit; the server's max_payload by default)."""
    too_large = too_large or _too_large
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise errors.InvalidInput(ErrorCode.REQUEST_INVALID, "Content-Length is not a number")
        if int(declared) > limit:
            raise too_large(limit)
    # The messages themselves, as Request.stream reads them, without its async generator
    # (one per request, each registered with the event loop's generator hooks).
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if not message.get("more_body", False):
            if not chunks:
                return chunk  # (the commonest case: the whole body in one message)
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def _too_large(limit: int) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(
        ErrorCode.REQUEST_TOO_LARGE,
        f"the body is over the limit of {limit} bytes (server max_payload)",
    )


_DESCRIPTIONS = {
    errors.InvalidInput: "Invalid name, subject, header or body",
    errors.Unauthorized: "Authentication required",
    errors.Forbidden: "Not allowed",
    errors.NotFound: "Not found",
    errors.Conflict: "Conflicts with the current state",
    errors.PreconditionFailed: "A precondition (expected sequence, revision) failed",
    errors.PayloadTooLarge: "Body or message over the limit",
    errors.Locked: "Pinned to another client",
    errors.TooManyRequests: "Too many requests",
    errors.Unavailable: "NATS or JetStream unavailable; retry after Retry-After",
    errors.Timeout: "NATS did not answer in time (writes: outcome unknown)",
}


def problems(*classes: type[errors.GatewayError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the given error classes, rendered as problem+json."""
    out: dict[int | str, dict[str, Any]] = {}
    listed: tuple[type[errors.GatewayError], ...] = (
        errors.InvalidInput,
        *classes,
        errors.Unavailable,
        errors.Timeout,
    )
    for cls in listed:
        out[cls.status] = {
            "description": _DESCRIPTIONS.get(cls, cls.__name__),
            "content": {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return out


class AnyTextConvertor(Convertor[str]):
    """Like ``path`` but also matching CR/LF, so a bad subject gets a 400 from the validator
    instead of falling through to a 404 for a route that seems not to exist."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("text", AnyTextConvertor())


class CounterSubjectConvertor(AnyTextConvertor):
    """Any text but ``read``: ``/v1/counters/{stream}/read`` is the multi read, so a counter
    route of the same shape leaves that path to it (its other methods are 405s)."""

    regex = r"(?!read\Z)[\s\S]+"


register_url_convertor("counter", CounterSubjectConvertor())


# -- OpenAPI links --------------------------------------------------------------------------
#
# What an answer lets a client do next, as OpenAPI links (an operation's ``openapi_extra``,
# deep-merged into its responses): a bucket made, then its keys written and read; a stream,
# then its messages and consumers; a pull, then its acks. Generated clients and schemathesis's
# stateful phase follow them. Parameters are runtime expressions ("$request.path.bucket",
# "$response.body#/seq").


def link(operation_id: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    found: dict[str, Any] = {"operationId": operation_id, "parameters": parameters}
    if body is not None:
        found["requestBody"] = body
    return found


def links(*statuses: int, **named: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` giving the responses of ``statuses`` the links ``named``."""
    return {"responses": {str(status): {"links": named} for status in statuses}}


def merged(*extras: dict[str, Any]) -> dict[str, Any]:
    """Several ``openapi_extra`` fragments as one (their top-level keys differ)."""
    out: dict[str, Any] = {}
    for extra in extras:
        assert not out.keys() & extra.keys(), "fragments that overlap"
        out.update(extra)
    return out
