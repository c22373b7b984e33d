"""Request context middleware: request id, access log line and HTTP metrics (pure ASGI);
it also refuses header blocks that are ambiguous (see :func:`_read_headers`). The limits on
request bodies: :class:`BodyLimitMiddleware` (every body) and :func:`read_json_body` (the
JSON bodies that FastAPI decodes)."""

from __future__ import annotations

import enum
import itertools
import os
import re
import time
from collections.abc import Awaitable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.accesslog import AccessLog
from app.errors import PROBLEM_CONTENT_TYPE, ErrorCode, GatewayError, InvalidInput, PayloadTooLarge
from app.http import read_body
from app.metrics import Metrics

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
REQUEST_ID_HEADER = b"x-request-id"


_SCOPE_KEY = "jsgw.request_id"


# Request ids: 32 hex digits, a random prefix per process and a counter (uuid4 reads the
# kernel's random source on every call, which showed in the hottest path's profile).
_ID_PREFIX = ""
_ID_COUNTER = itertools.count()


def _reseed_request_ids() -> None:
    global _ID_PREFIX, _ID_COUNTER  # per process, also in forked workers
    _ID_PREFIX = os.urandom(10).hex()
    _ID_COUNTER = itertools.count(int.from_bytes(os.urandom(4)) << 16)


_reseed_request_ids()
os.register_at_fork(after_in_child=_reseed_request_ids)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFF:012x}"


def request_id_of(scope: Scope) -> str | None:
    return scope.get(_SCOPE_KEY)


class RequestContext:
    """What every request gets around its answer: a request id (the caller's valid one, else a
    new one), the refusal of an ambiguous header block, the in-flight gauge, the HTTP metrics
    and the access line. Used by :class:`RequestContextMiddleware` and by the lean paths
    served from the protocol (app.fastpath.DirectPaths), so both do the same."""

    __slots__ = ("access_log", "metrics")

    def __init__(self, metrics: Metrics, access_log: AccessLog | None) -> None:
        self.metrics = metrics
        self.access_log = access_log  # None: JSGW_ACCESS_LOG off

    def begin(self, scope: Scope) -> tuple[str, InvalidInput | None]:
        """The request's id (also put in the scope) and the header block's refusal, if any;
        counts the request in flight."""
        incoming_id, refusal = _read_headers(scope)
        request_id = incoming_id or new_request_id()
        # In the scope itself: scope["state"] may be shared by concurrent requests (it is a
        # copy of the lifespan state only if the server makes one).
        scope[_SCOPE_KEY] = request_id
        if scope["path"] not in _PROBES:
            requests = self.metrics.requests
            requests.in_flight += 1
            if requests.shared is not None:  # (several workers)
                requests.shared.in_flight(requests.in_flight)
        return request_id, refusal

    def end(self, scope: Scope, request_id: str, status: int, started: float) -> None:
        """The request is answered (``status``; 500 when no answer began): metrics and the
        access line."""
        elapsed = time.perf_counter() - started
        route = _route_template(scope)
        if scope["path"] not in _PROBES:
            requests = self.metrics.requests
            requests.in_flight -= 1
            if requests.shared is not None:
                requests.shared.in_flight(requests.in_flight)
            self.metrics.observe_http(scope["method"], route, status, elapsed)
        if self.access_log is not None:
            self.access_log.request(
                request_id,
                scope["method"],
                scope["path"],
                route,
                status,
                elapsed,
                scope.get("client"),
            )


class AddedHeaders:
    """A ``send`` that adds headers to the response start (a ``connection`` one only when the
    answer has none) and keeps the answer's status (500 until it starts)."""

    __slots__ = ("extra", "send", "status")

    def __init__(self, send: Send, extra: list[tuple[bytes, bytes]]) -> None:
        self.send = send
        self.extra = extra
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = list(message.get("headers", ()))
            headers += without_second_connection(headers, self.extra)
            message["headers"] = headers
        await self.send(message)


def without_second_connection(
    headers: list[tuple[bytes, bytes]], extra: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """``extra``, less its ``connection`` header when ``headers`` has one."""
    if any(name == b"connection" for name, _ in extra) and any(
        name.lower() == b"connection" for name, _ in headers
    ):
        return [(name, value) for name, value in extra if name != b"connection"]
    return extra


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, access_log: AccessLog | None) -> None:
        self.app = app
        self.context = RequestContext(metrics, access_log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id, refusal = self.context.begin(scope)
        send_with_id = AddedHeaders(send, [(REQUEST_ID_HEADER, request_id.encode())])
        app = self.app
        if refusal is not None:
            app = _problem_app(refusal)  # still logged and counted like any request
        try:
            await app(scope, receive, send_with_id)
        finally:
            self.context.end(scope, request_id, send_with_id.status, started)


# Headers the gateway reads as one value. Of a repeated one it would use the first line and
# ignore the rest, while a proxy in front may have used the last: two Authorization headers,
# or If-Match "1" and If-Match "2" (which RFC 9110 joins into a list, refused as one line),
# must not pass as whichever comes first.
_SINGLE_HEADERS = frozenset({b"authorization", b"if-match", b"nats-pin-id", b"last-event-id"})
# If-None-Match: a list of revisions on reads, only "*" on writes.
_READS = frozenset({"GET", "HEAD"})


def _read_headers(scope: Scope) -> tuple[str | None, InvalidInput | None]:
    """In one pass over the header block: the caller's request id (when it is a valid one) and
    a 400 for a header block the gateway will not guess about (else None).

    CR, LF and NUL are refused in every field value (RFC 9110 5.5): HTTP servers refuse them
    already, but another ASGI server or a test client may not, and a value such as
    'If-Match: "7"\\r\\n' would be taken for revision 7 after stripping.
    """
    request_id: str | None = None
    refusal: InvalidInput | None = None
    seen_id = False
    seen: set[bytes] = set()
    for name, value in scope.get("headers", ()):
        # (Bytes as ints: ``13 in value`` is a plain scan, ``b"\r" in value`` a substring search
        # costing several times as much, for every header of every request.)
        if 13 in value or 10 in value or 0 in value:
            refusal = refusal or InvalidInput(
                ErrorCode.HEADER_INVALID,
                f"header {name.decode('latin-1')!r}: CR, LF and NUL are not allowed in a value",
            )
        if name == REQUEST_ID_HEADER:
            if not seen_id:  # the first one counts
                seen_id = True
                text = value.decode("latin-1")
                request_id = text if _REQUEST_ID.fullmatch(text) else None
        elif name in _SINGLE_HEADERS or (
            name == b"if-none-match" and scope["method"] not in _READS
        ):
            if name in seen:
                refusal = refusal or InvalidInput(
                    ErrorCode.HEADER_DUPLICATE,
                    f"header {name.decode('latin-1')!r} is given more than once",
                )
            seen.add(name)
    return request_id, refusal


def _problem_app(error: GatewayError) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = orjson.dumps(error.problem(request_id_of(scope)))
        headers = [
            (b"content-type", PROBLEM_CONTENT_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _route_template(scope: Scope) -> str:
    route: Any = scope.get("route")
    # path_format: the template without convertors ({key}, not {key:text}).
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) else "<unmatched>"


_HTTP1 = frozenset({"1.0", "1.1"})


class Framing(enum.Enum):
    """How a request declares its body, against a limit."""

    NONE = "none"  # neither Content-Length nor Transfer-Encoding
    EMPTY = "empty"  # Content-Length: 0
    DECLARED = "declared"  # a Content-Length within the limit
    OVER = "over"  # a Content-Length over the limit
    OTHER = "other"  # Transfer-Encoding, or a Content-Length that is not a number


def body_framing(scope: Scope, limit: int) -> Framing:
    declared = other = empty = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            if not value.isdigit():
                other = True
            elif int(value) > limit:
                return Framing.OVER
            else:
                declared = True
                empty = value.strip(b"0") == b""
        elif name == b"transfer-encoding":
            other = True
    if other:
        return Framing.OTHER
    if declared:
        return Framing.EMPTY if empty else Framing.DECLARED
    return Framing.NONE


class BodyLimitMiddleware:
    """Refuse request bodies over ``limit`` bytes before they are buffered (413).

    A declared Content-Length over the limit is refused before reading; any other body is
    counted as it arrives and cut off as soon as it passes the limit. HTTP/1 requests that
    declare no body (no Content-Length, no Transfer-Encoding: most GETs) are passed on
    untouched.

    A request answered before its body was received whole (refused by authentication or a
    limit, or answered without reading it) is answered with ``Connection: close``: kept open,
    uvicorn would read and drop the rest of the body, however long, before the next request.
    Closed, what was not read is not read (uvicorn stops reading a body nobody takes at 64 KiB).
    """

    def __init__(
        self, app: ASGIApp, limit: int, streamed: tuple[tuple[str, re.Pattern[str]], ...] = ()
    ) -> None:
        self.app = app
        self.limit = limit
        # (method, path pattern) of the routes that stream their body to NATS as it arrives
        # (object uploads): the limit does not apply to them; the rest of this still does.
        self.streamed = streamed

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # A plain function: a request passed on untouched costs no coroutine of its own (the
        # caller awaits the inner app's directly).
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        if self.streamed and self._is_streamed(scope):
            return self._counted(scope, receive, send, False, limit=None)
        framing = body_framing(scope, self.limit)
        if framing is Framing.OVER:
            return self._refuse(scope, send)
        if framing is Framing.NONE and scope.get("http_version") in _HTTP1:
            # HTTP/1 without Content-Length or Transfer-Encoding: there is no body to count.
            # (A declared length is still counted: a test client or another ASGI server may
            # deliver more than it says.)
            return self.app(scope, receive, send)
        return self._counted(scope, receive, send, framing is Framing.EMPTY)

    def _is_streamed(self, scope: Scope) -> bool:
        method, path = scope.get("method"), scope.get("path", "")
        return any(m == method and p.fullmatch(path) for m, p in self.streamed)

    async def _counted(
        self, scope: Scope, receive: Receive, send: Send, empty: bool, limit: int | None = -1
    ) -> None:
        limit = self.limit if limit == -1 else limit
        received = 0
        complete = empty  # the body has been received whole

        async def counting_receive() -> Message:
            nonlocal received, complete
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if limit is not None and received > limit:
                    # Starlette's HTTPException passes through body parsing untouched.
                    raise HTTPException(413, self._detail())
                if not message.get("more_body", False):
                    complete = True
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not complete:
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    headers.append((b"connection", b"close"))
                    message["headers"] = headers
            await send(message)

        await self.app(scope, counting_receive, closing_send)

    def _detail(self) -> str:
        return f"the request body is over the limit of {self.limit} bytes (JSGW_MAX_BODY)"

    async def _refuse(self, scope: Scope, send: Send) -> None:
        error = PayloadTooLarge(ErrorCode.REQUEST_TOO_LARGE, self._detail())
        body = orjson.dumps(error.problem(request_id_of(scope)))
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_CONTENT_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def read_json_body(request: Request) -> Request:
    """The request, its body read whole within ``JSGW_MAX_JSON_BODY``, for FastAPI to decode.

    JSON is decoded and validated whole, on the event loop, into several times its size in
    objects: its bound is the JSON one, well below the raw bodies' ``JSGW_MAX_BODY``. A
    declared Content-Length over it is refused before anything is read, any other body as
    soon as it passes it (413 ``request.json_too_large``); the rest is left unread, and the
    connection is closed after the answer (:class:`BodyLimitMiddleware`). The request handed
    back replays the body, then receives as the original (a disconnect, for the streams).
    """
    limit: int = request.state.runtime.settings.max_json_body
    body = await read_body(request, limit, _json_too_large)
    receive = request.receive
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, replay)


def _json_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        ErrorCode.REQUEST_JSON_TOO_LARGE,
        f"the JSON body is over the limit of {limit} bytes (JSGW_MAX_JSON_BODY)",
    )
