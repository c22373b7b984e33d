"""The answer to a publish, built from the server's PubAck bytes or from its parsed fields:
the same JSON either way."""

from __future__ import annotations

import orjson
import pytest

from app import errors
from app.nats.replies import Reply
from app.publish.service import Outgoing, answer, answer_json

MESSAGE = Outgoing("orders.1", b"x", {})


@pytest.mark.parametrize(
    "data",
    [
        b'{"stream":"ORDERS","seq":1}',  # the server's template: answered from these bytes
        b'{"stream":"a-b_C9","seq":18446744073709551615}',
        b'{"stream":"ORDERS","domain":"hub","seq":7}',
        b'{"stream":"ORDERS","seq":7,"duplicate":true}',
        b'{"stream":"COUNT","seq":3,"val":"12"}',
        b'{"stream":"caf\xc3\xa9","seq":2}',
        b'{"stream":"a\\u0022b","seq":2}',
        b'{"stream": "ORDERS", "seq": 4}',
        b'{"seq":4,"stream":"ORDERS"}',
    ],
)
def test_the_same_json_from_the_bytes_or_the_fields(data: bytes) -> None:
    reply = Reply(None, data)
    made = answer_json(reply, MESSAGE)
    assert made == orjson.dumps(answer(reply, MESSAGE))
    assert orjson.loads(made)["duplicate"] is (b'"duplicate":true' in data)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b'{"stream":"ORDERS","seq":0}', errors.OutcomeUnknown),
        (b'{"stream":"ORDERS"}', errors.UpstreamError),
        (b'{"stream":"ORDERS","seq":1', errors.UpstreamError),
        (
            b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"}}',
            errors.PreconditionFailed,
        ),
    ],
)
def test_what_is_no_plain_pub_ack_is_refused_alike(
    data: bytes, kind: type[errors.GatewayError]
) -> None:
    with pytest.raises(kind):
        answer_json(Reply(None, data), MESSAGE)
