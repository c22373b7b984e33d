"""KV entries as HTTP responses (shared by the KV router and the lean read path)."""

from __future__ import annotations

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
    return headers


def entry_response(entry: Entry, request_headers: Headers, if_none_match: str | None) -> Response:
    """304 when If-None-Match names the revision; Entry JSON when asked for; else raw bytes."""
    response: Response
    if if_none_match_hits(if_none_match, entry.revision):
        response = Response(status_code=304)
    elif wants_json(request_headers):
        response = JSON(entry.to_json())
    else:
        response = Response(entry.value or b"", media_type="application/octet-stream")
    response.raw_headers.extend(entry_headers(entry))
    return response
