"""KV entries as HTTP responses (shared by the KV router and the lean read path)."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import Response

from app.http import JSON, wants_json
from app.services.kv_model import Entry, etag, if_none_match_hits


def entry_headers(entry: Entry) -> dict[str, str]:
    headers = {
        "ETag": etag(entry.revision),
        "KV-Revision": str(entry.revision),
        "KV-Operation": entry.operation,
    }
    if entry.created:
        headers["KV-Created"] = entry.created
    return headers


def entry_response(entry: Entry, request_headers: Headers, if_none_match: str | None) -> Response:
    """304 when If-None-Match names the revision; Entry JSON when asked for; else raw bytes."""
    headers = entry_headers(entry)
    if if_none_match_hits(if_none_match, entry.revision):
        return Response(status_code=304, headers=headers)
    if wants_json(request_headers):
        return JSON(entry.to_json(), headers=headers)
    return Response(entry.value or b"", media_type="application/octet-stream", headers=headers)
