"""BodyLimitMiddleware: which bodies are counted as they arrive, and when a 413 is answered."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.exceptions import HTTPException

from app.middleware import BodyLimitMiddleware

LIMIT = 10


def scope(headers: list[tuple[bytes, bytes]], http_version: str = "1.1") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/x",
        "http_version": http_version,
        "headers": headers,
    }


async def serve(scope: dict[str, Any], chunks: list[bytes]) -> tuple[list[dict], Any, bytes]:
    """What was sent, the receive the app was given, and the body the app read."""
    sent: list[dict] = []
    given: list[Any] = []
    pending = list(chunks)

    async def receive() -> dict:
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    body = bytearray()

    async def app(scope: Any, receive_: Any, send_: Any) -> None:
        given.append(receive_)
        while True:
            message = await receive_()
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                return

    await BodyLimitMiddleware(app, LIMIT)(scope, receive, send)
    return sent, (given[0] if given else None), bytes(body)


async def test_declared_length_over_the_limit_is_refused_unread() -> None:
    sent, given, _ = await serve(scope([(b"content-length", b"11")]), [b"x" * 11])
    assert given is None
    assert sent[0]["status"] == 413


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_http1_requests_without_a_body_are_not_counted(version: str) -> None:
    sent, given, body = await serve(scope([], version), [b""])
    assert given is not None and given.__name__ == "receive"  # the server's own
    assert body == b"" and sent == []


@pytest.mark.parametrize(
    "headers, version",
    [
        ([(b"transfer-encoding", b"chunked")], "1.1"),
        ([], "2"),
        ([(b"content-length", b"1x")], "1.1"),
        ([(b"content-length", b"10")], "1.1"),
        ([(b"content-length", b"10")], "2"),
    ],
)
async def test_other_bodies_are_counted_and_cut_off(headers: list, version: str) -> None:
    _, given, body = await serve(scope(headers, version), [b"12345", b"67890"])
    assert given.__name__ == "counting_receive" and body == b"1234567890"  # at the limit: fine
    with pytest.raises(HTTPException) as refused:
        await serve(scope(headers, version), [b"12345", b"67890", b"1"])
    assert refused.value.status_code == 413


async def test_a_length_that_understates_the_body_does_not_get_it_through() -> None:
    # uvicorn stops at Content-Length; a test client or another server may not.
    with pytest.raises(HTTPException) as refused:
        await serve(scope([(b"content-length", b"5")]), [b"x" * 11])
    assert refused.value.status_code == 413
