from __future__ import annotations

import pytest

from app import errors


@pytest.mark.parametrize(
    ("err_code", "status", "code"),
    [
        (10059, 404, "stream.not_found"),
        (10014, 404, "consumer.not_found"),
        (10058, 409, "stream.exists"),
        (10071, 412, "publish.wrong_last_sequence"),
        (10070, 412, "publish.wrong_last_msg_id"),
        (10054, 413, "message.too_large"),
        (10037, 404, "message.not_found"),
    ],
)
def test_mapping_by_err_code(err_code: int, status: int, code: str) -> None:
    # The description is deliberately misleading: only err_code counts.
    error = errors.from_jetstream(
        {"code": 400, "err_code": err_code, "description": "stream not found"}
    )
    assert (error.status, error.code) == (status, code)
    assert type(error) is error.code.error_class
    assert error.nats == {"code": 400, "err_code": err_code, "description": "stream not found"}


def test_fallbacks_by_server_code() -> None:
    assert errors.from_jetstream({"code": 404, "err_code": 1, "description": "x"}).status == 404
    assert errors.from_jetstream({"code": 503, "err_code": 1, "description": "x"}).status == 503
    assert errors.from_jetstream({"code": 400, "err_code": 1, "description": "x"}).status == 400
    assert errors.from_jetstream({"code": 500, "err_code": 1, "description": "x"}).status == 502


def test_problem_document() -> None:
    body = errors.PreconditionFailed(
        errors.ErrorCode.KV_REVISION_MISMATCH, "rev 3", extra={"revision": 4}
    ).problem("r1")
    assert body == {
        "type": "https://jsgw.dev/problems/kv.revision_mismatch",
        "title": "Precondition Failed",
        "status": 412,
        "detail": "rev 3",
        "code": "kv.revision_mismatch",
        "instance": "r1",
        "revision": 4,
    }
