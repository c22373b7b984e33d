"""app.http.read_body: the body as its messages bring it, bounded, and a client gone."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import ClientDisconnect, Request

from app import errors
from app.http import read_body


def request(
    messages: list[dict[str, Any]], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> Request:
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": list(headers)}
    return Request(scope, receive)


def part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_one_message_is_the_body() -> None:
    assert await read_body(request([part(b"abc", False)]), 10) == b"abc"


async def test_a_message_without_a_body_is_an_empty_body() -> None:
    assert await read_body(request([{"type": "http.request"}]), 10) == b""


async def test_several_messages_are_joined_in_order() -> None:
    messages = [part(b"ab", True), part(b"", True), part(b"cd", True), part(b"e", False)]
    assert await read_body(request(messages), 10) == b"abcde"


async def test_a_body_over_the_limit_is_refused_at_the_message_that_passes_it() -> None:
    messages = [part(b"abcdef", True), part(b"ghijk", True)]  # (no third message is asked)
    with pytest.raises(errors.PayloadTooLarge):
        await read_body(request(messages), 10)


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(errors.PayloadTooLarge):
        await read_body(request([], ((b"content-length", b"11"),)), 10)


async def test_a_client_gone_mid_body_is_a_disconnect() -> None:
    with pytest.raises(ClientDisconnect):
        await read_body(request([part(b"ab", True), {"type": "http.disconnect"}]), 10)
