"""KV entries as HTTP responses."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import Response

from app.http import JSON, wants_json
from app.kv.model import Entry, etag, if_none_match_hits


def entry_headers(entry: Entry) -> list[tuple[bytes, bytes]]:
    """``ETag``, ``KV-Revision``, ``KV-Operation`` and, when known, ``KV-Created``: as ASGI
    header pairs, which every answer about an entry carries."""
    revision = str(entry.revision)
    headers = [
        (b"etag", etag(entry.revision).encode()),
        (b"kv-revision", revision.encode()),
        (b"kv-operation", entry.operation.encode()),
    ]
    if entry.created:
        headers.append((b"kv-created", entry.created.encode()))
    if entry.stream:
        headers.append((SERVED_BY, entry.stream.encode()))
    return headers


SERVED_BY = b"kv-served-by"
"""The stream that answered a read: the bucket's, or a mirror's (ADR-8 topologies)."""


def served_by(entries: Iterable[Entry]) -> dict[str, str]:
    """``KV-Served-By`` for an answer of several entries: the streams that served them."""
    streams = sorted({entry.stream for entry in entries if entry.stream})
    return {"KV-Served-By": ", ".join(streams)} if streams else {}


class _Value(Response):
    """An entry's raw bytes: what ``Response(value, media_type="application/octet-stream")``
    with ``entry_headers`` builds, without its generic header handling (the commonest answer
    of the hottest route)."""

    media_type = "application/octet-stream"

    def __init__(self, entry: Entry) -> None:
        body = entry.value or b""
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", b"application/octet-stream"),
            *entry_headers(entry),
        ]


def entry_response(entry: Entry, request_headers: Headers, if_none_match: str | None) -> Response:
    """304 when If-None-Match names the revision; Entry JSON when asked for; else raw bytes."""
    response: Response
    if if_none_match_hits(if_none_match, entry.revision):
        response = Response(status_code=304)
    elif wants_json(request_headers):
        response = JSON(entry.to_json())
    else:
        return _Value(entry)
    response.raw_headers.extend(entry_headers(entry))
    return response
