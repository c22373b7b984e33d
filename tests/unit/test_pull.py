from __future__ import annotations

import orjson
import pytest
from nats.aio.msg import Msg
from nats.js.api import Header

from app import errors
from app.nats.pull import PullRequest, message_size, status_of


def _status_msg(code: str, description: str, **headers: str) -> Msg:
    # The shape nats-py gives a status message: no reply, status pseudo headers.
    hdrs = {"Status": code, Header.DESCRIPTION: description, **headers}
    return Msg(_client=None, subject="_INBOX.x.1", reply="", data=b"", headers=hdrs)  # type: ignore[arg-type]


def test_payload_leaves_out_what_is_unset() -> None:
    assert orjson.loads(PullRequest().payload()) == {"batch": 1}
    full = PullRequest(
        batch=10,
        max_bytes=0,
        expires_ns=5_000_000_000,
        heartbeat_ns=1_000_000_000,
        no_wait=True,
        group="jobs",
        min_pending=100,
        min_ack_pending=7,
        priority=2,
        pin_id="PIN",
    )
    assert orjson.loads(full.payload()) == {
        "batch": 10,
        "expires": 5_000_000_000,
        "idle_heartbeat": 1_000_000_000,
        "no_wait": True,
        "group": "jobs",
        "min_pending": 100,
        "min_ack_pending": 7,
        "priority": 2,
        "id": "PIN",
    }


def test_user_messages_are_not_statuses() -> None:
    msg = Msg(
        _client=None,
        subject="orders.1",
        reply="$JS.ACK.S.C.1.1.1.1.0",
        data=b"x",  # type: ignore[arg-type]
        headers={"Status": "100"},
    )
    assert status_of(msg) is None


def test_status_with_pending_counts() -> None:
    status = status_of(
        _status_msg(
            "408", "Request Timeout", **{"Nats-Pending-Messages": "3", "Nats-Pending-Bytes": "1024"}
        )
    )
    assert status is not None
    assert (status.code, status.description) == (408, "Request Timeout")
    assert (status.pending_messages, status.pending_bytes) == (3, 1024)
    assert status.ends_quietly and not status.terminal


@pytest.mark.parametrize(
    ("code", "description", "quiet", "terminal", "error_status", "error_code"),
    [
        ("404", "No Messages", True, False, None, None),
        ("408", "Request Timeout", True, False, None, None),
        ("409", "Message Size Exceeds MaxBytes", True, False, None, None),
        ("409", "Batch Completed", True, False, None, None),
        ("409", "Leadership Change", True, False, None, None),
        ("409", "Consumer Deleted", False, True, 404, "consumer.deleted"),
        ("409", "Consumer is push based", False, True, 409, "consumer.push_based"),
        ("409", "Exceeded MaxRequestBatch of 5", False, True, 409, "consumer.max_batch_exceeded"),
        (
            "409",
            "Exceeded MaxRequestExpires of 3s",
            False,
            True,
            409,
            "consumer.max_expires_exceeded",
        ),
        (
            "409",
            "Exceeded MaxRequestMaxBytes of 1000",
            False,
            True,
            409,
            "consumer.max_bytes_exceeded",
        ),
        ("409", "Exceeded MaxWaiting", False, False, 429, "consumer.max_waiting_exceeded"),
        (
            "400",
            "Bad Request - Priority Group missing",
            False,
            True,
            409,
            "consumer.group_required",
        ),
        ("400", "Bad Request - Invalid Priority Group", False, True, 409, "consumer.group_invalid"),
        (
            "400",
            "Bad Request - Not a Overflow Priority consumer",
            False,
            True,
            409,
            "consumer.not_overflow",
        ),
        (
            "400",
            "Bad Request - heartbeat value too large",
            False,
            True,
            400,
            "consumer.heartbeat_invalid",
        ),
        ("400", "Bad Request - something new", False, True, 400, "consumer.pull_invalid"),
        ("423", "Nats-Pin-Id mismatch", False, False, 423, "consumer.pin_mismatch"),
        ("423", "Nats-Wrong-Pin-Id", False, False, 423, "consumer.pin_mismatch"),
        ("418", "Something Else", False, False, 502, "consumer.pull_failed"),
    ],
)
def test_status_classes(
    code: str,
    description: str,
    quiet: bool,
    terminal: bool,
    error_status: int | None,
    error_code: str | None,
) -> None:
    status = status_of(_status_msg(code, description))
    assert status is not None
    assert status.ends_quietly is quiet
    assert status.terminal is terminal
    if error_code is not None:
        error = status.error()
        assert isinstance(error, errors.GatewayError)
        assert (error.status, error.code) == (error_status, error_code)
        assert error.nats == {"code": int(code), "description": description}


def test_heartbeat_and_pin_loss() -> None:
    heartbeat = status_of(_status_msg("100", "Idle Heartbeat"))
    assert heartbeat is not None and heartbeat.heartbeat and not heartbeat.terminal
    lost = status_of(_status_msg("423", "Nats-Wrong-Pin-Id"))
    assert lost is not None and lost.pin_lost


def test_message_size_counts_like_the_server() -> None:
    # consumer.go: len(subject) + len(ack reply) + len(header block) + len(payload)
    msg = Msg(
        _client=None,
        subject="s.0",
        reply="$JS.ACK.S.C.1.1.1.1795357669902044619.2",  # type: ignore[arg-type]
        data=b"x" * 100,
        headers=None,
    )
    assert message_size(msg) == 3 + 39 + 100  # 142, as the server reported in a 409
    with_headers = Msg(_client=None, subject="s", reply="r", data=b"", headers={"A": "1"})  # type: ignore[arg-type]
    assert message_size(with_headers) == 1 + 1 + len(b"NATS/1.0\r\nA: 1\r\n\r\n")
