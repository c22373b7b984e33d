from __future__ import annotations

import orjson
import pytest

from app.errors import ErrorCode, InvalidInput, Timeout, Unavailable, UpstreamError
from app.metrics import Metrics
from app.nats.jsapi import parse_response
from app.nats.replies import Reply
from app.publish.service import Outgoing, Publisher, http_publish_headers, message_headers


def test_allowlist_and_aliases() -> None:
    headers = http_publish_headers(
        [
            ("idempotency-key", "k1"),
            ("nats-expected-last-sequence", "007"),
            ("nats-header-x-trace-id", "abc"),
            ("nats-ttl", "90"),
            ("authorization", "Bearer secret"),
            ("content-type", "text/plain"),
        ]
    )
    assert headers == {
        "Nats-Msg-Id": "k1",
        "Nats-Expected-Last-Sequence": "7",
        "X-Trace-Id": "abc",
        "Nats-TTL": "90s",
    }


@pytest.mark.parametrize(
    "pairs",
    [
        [("nats-msg-id", "a"), ("idempotency-key", "b")],
        [("nats-header-nats-rollup", "all")],
        [("nats-header-status", "503")],
        [("nats-msg-id", "a\r\nPUB x 1")],
        [("nats-msg-id", "")],
        [("nats-expected-stream", "a.b")],
        [("nats-expected-last-sequence", "-1")],
        [("nats-header-bad name", "x")],
    ],
)
def test_refused(pairs: list[tuple[str, str]]) -> None:
    with pytest.raises(InvalidInput):
        http_publish_headers(pairs)


def test_batch_headers_keep_their_case() -> None:
    assert message_headers({"traceId": "1", "nats-msg-id": "m"}, None) == {
        "traceId": "1",
        "Nats-Msg-Id": "m",
    }
    with pytest.raises(InvalidInput):
        message_headers({"Nats-Msg-Id": "m"}, "m")


async def test_an_atomic_batch_without_the_commits_reply_is_a_bad_response() -> None:
    """(request_batch raises when the commit's reply does not come; should it ever return
    none, that is a 502, not an AssertionError.)"""
    publisher = Publisher(None, None, Metrics())  # type: ignore[arg-type]
    staged = Reply(None, b"")
    with pytest.raises(UpstreamError) as raised:
        await publisher._atomic_outcome([staged, None], [Outgoing("a", b"", {})] * 2, "id")
    assert raised.value.code is ErrorCode.JETSTREAM_BAD_RESPONSE


class _Answering:
    """JetStream's API answering STREAM.NAMES with ``answer`` (an error object, or raising)."""

    def __init__(self, answer: dict | Exception) -> None:
        self.answer = answer
        self.settings = type(
            "Settings", (), {"retry_after": 1, "nats_probe_timeout": 1.0, "request_timeout": 5.0}
        )()

    async def call(self, *args: object, **kwargs: object) -> dict:
        if isinstance(self.answer, Exception):
            raise self.answer
        return parse_response(orjson.dumps(self.answer))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # No meta leader right now (an election): the write is sent again.
        (
            {
                "error": {
                    "code": 503,
                    "err_code": 10008,
                    "description": "JetStream system temporarily unavailable",
                }
            },
            ErrorCode.STREAM_UNAVAILABLE,
        ),
        (Timeout(ErrorCode.NATS_TIMEOUT, "no answer"), ErrorCode.STREAM_UNAVAILABLE),
        ({"streams": ["S"]}, ErrorCode.STREAM_UNAVAILABLE),
        ({"streams": None}, ErrorCode.STREAM_NO_MATCH),
        # JetStream did not answer at all (not enabled): not sent again.
        (
            Unavailable(ErrorCode.JETSTREAM_UNAVAILABLE, "no JetStream"),
            ErrorCode.JETSTREAM_UNAVAILABLE,
        ),
    ],
)
async def test_why_nobody_took_a_write(answer: dict | Exception, expected: ErrorCode) -> None:
    api = _Answering(answer)
    publisher = Publisher(api, api, Metrics())  # type: ignore[arg-type]
    problem = await publisher._why_no_responders("s.x")
    assert problem.code is expected
    assert expected is ErrorCode.STREAM_NO_MATCH or problem.headers["Retry-After"] == "1"
