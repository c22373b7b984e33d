"""The ack route sends its results as the service builds them: the JSON that its
response_model (AckBatchResult, None left out) would make of them."""

from __future__ import annotations

import nats.errors
import orjson

from app.consumers.schemas import AckBatchResult
from app.consumers.service import _ack_result
from app.nats import acks
from app.nats.replies import ConnectionLost, Reply


def test_results_are_what_the_response_model_serializes() -> None:
    subject = acks.parse_ack_subject("$JS.ACK.S.C.1.5.5.1700000000000000000.0")
    assert subject is not None
    replies: list[Reply | Exception] = [
        Reply(None, b""),
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        ConnectionLost(),
        Reply(b"NATS/1.0\r\n\r\n", b"+OK"),
    ]
    for gone in (False, True):  # nobody took an ack: the consumer is gone, or has no leader
        results = [_ack_result(i, subject, reply, gone) for i, reply in enumerate(replies)]
        body = {"results": results}
        model = AckBatchResult.model_validate(body).model_dump(mode="json", exclude_none=True)
        assert orjson.dumps(body) == orjson.dumps(model)
        assert [r["ok"] for r in body["results"]] == [True, False, False, False, True]
        code = "consumer.not_found" if gone else "consumer.offline"
        assert body["results"][2]["error"]["code"] == code
