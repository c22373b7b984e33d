"""Revision floors: bounded, raised by what is seen, brought down only by the stream leader.

The reads themselves against a real nats-server (a replica left behind) are in
tests/integration/test_kv_monotonic.py; here, what no single server can be made to do on
cue: a stream leader that does not answer while a replica answers behind the floor.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest

from app import errors
from app.config import Settings
from app.kv.service import KVService
from app.metrics import Metrics
from app.nats.direct import StoredMessage
from app.nats.floors import RevisionFloors
from app.nats.pool import NatsPool


def test_a_floor_only_rises() -> None:
    floors = RevisionFloors()
    floors.advance("$KV.b.k", 5)
    floors.advance("$KV.b.k", 3)
    assert floors.revisions == {"$KV.b.k": 5}
    floors.advance("$KV.b.k", 0)
    assert floors.revisions == {"$KV.b.k": 5}


def test_the_key_raised_longest_ago_is_dropped_past_the_bound() -> None:
    floors = RevisionFloors(max_keys=3)
    for key in "abc":
        floors.advance(key, 1)
    floors.advance("a", 2)  # raised again: now the newest
    floors.advance("d", 1)
    assert list(floors.revisions) == ["c", "a", "d"]
    assert len(floors) == 3


def test_the_leaders_older_answer_replaces_the_floor_it_was_checked_against() -> None:
    floors = RevisionFloors()
    floors.advance("k", 9)
    floors.settle("k", 9, 4)  # the key went back (a purge by other means)
    assert floors.revisions == {"k": 4}
    floors.settle("k", 4, 0)  # no message at all
    assert floors.revisions == {}
    floors.settle("k", 0, 7)
    assert floors.revisions == {"k": 7}


def test_a_floor_raised_meanwhile_stands() -> None:
    floors = RevisionFloors()
    floors.advance("k", 9)
    floors.advance("k", 12)  # a write answered while the leader was asked
    floors.settle("k", 9, 4)
    assert floors.revisions == {"k": 12}


class _Direct:
    """A replica's Direct Get, behind: it answers revision 3."""

    async def last_for(self, stream: str, subject: str) -> StoredMessage:
        return StoredMessage(stream, subject, 3, "2026-01-01T00:00:00Z", {}, b"3")


class _Leader:
    """The JetStream API, the stream leader's ``STREAM.MSG.GET`` included."""

    def __init__(self, answer: Exception | dict[str, Any]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, ...]] = []
        # Not connected: what the reads take of it is the request timeout (NatsPool.within).
        self.pool = NatsPool(
            Settings(nats_url=["nats://127.0.0.1:1"]), ["nats://127.0.0.1:1"], Metrics()
        )

    async def call(self, operation: str, *tokens: str, **_: Any) -> dict[str, Any]:
        self.asked.append(tokens)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _service(leader: _Leader, metrics: Metrics) -> KVService:
    settings = Settings(nats_url=["nats://127.0.0.1:1"])
    return KVService(leader, _Direct(), None, settings, metrics)  # type: ignore[arg-type]


async def test_a_stale_answer_is_never_given_when_the_leader_does_not_answer() -> None:
    metrics = Metrics()
    # What a stream without a leader answers STREAM.MSG.GET with (10008), as the API maps it.
    leader = _Leader(
        errors.from_jetstream(
            {"code": 503, "err_code": 10008, "description": "JetStream cluster not available"}
        )
    )
    kv = _service(leader, metrics)
    try:
        kv.floors.advance("$KV.b.k", 5)
        with pytest.raises(errors.Unavailable) as raised:
            await kv.get("b", "k")
        assert raised.value.headers == {"Retry-After": "1"}
        assert leader.asked == [("STREAM", "MSG", "GET", "KV_b")]
        assert kv.floors.revisions == {"$KV.b.k": 5}
        assert metrics.registry.get_sample_value("jsgw_kv_stale_reads_total") == 1

        # The leader's answer is the one given, and a later one behind it is caught too.
        leader.answer = {"message": {"subject": "$KV.b.k", "seq": 6, "data": "Ng=="}}
        entry = await kv.get("b", "k")
        assert (entry.revision, entry.value) == (6, b"6")
        assert kv.floors.revisions == {"$KV.b.k": 6}
        assert metrics.registry.get_sample_value("jsgw_kv_stale_reads_total") == 2
    finally:
        await kv.close()


class _RefusingPublisher:
    """A deposed stream leader: every conditional write is refused (wrong last sequence)."""

    def __init__(self) -> None:
        self.pool = SimpleNamespace(timeout=1.0, max_payload=1024 * 1024)
        self.msg_ids: list[str] = []

    async def publish(self, message: Any, **_: Any) -> dict[str, Any]:
        self.msg_ids.append(message.headers["Nats-Msg-Id"])
        raise errors.from_jetstream(
            {"code": 400, "err_code": 10071, "description": "wrong last sequence: 5"}
        )


def _last_message(seq: int, msg_id: str) -> dict[str, Any]:
    headers = base64.b64encode(f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n".encode())
    return {"message": {"subject": "$KV.b.k", "seq": seq, "hdrs": headers.decode(), "data": ""}}


async def test_a_write_refused_by_a_deposed_leader_and_stored_by_the_new_one_is_stored() -> None:
    publisher = _RefusingPublisher()
    leader = _Leader({})
    settings = Settings(nats_url=["nats://127.0.0.1:1"])
    kv = KVService(leader, _Direct(), publisher, settings, Metrics())  # type: ignore[arg-type]
    try:

        async def refused_then_found(operation: str, *tokens: str, **_: Any) -> dict[str, Any]:
            return _last_message(6, publisher.msg_ids[-1])  # this very write, at revision 6

        leader.call = refused_then_found  # type: ignore[method-assign]
        assert await kv._write("KV_b", "$KV.b.k", "k", b"v", {}, expected=5) == 6
        assert kv.floors.revisions == {"$KV.b.k": 6}

        async def another_write(operation: str, *tokens: str, **_: Any) -> dict[str, Any]:
            return _last_message(6, "someone-else")

        leader.call = another_write  # type: ignore[method-assign]
        with pytest.raises(errors.PreconditionFailed) as refused:
            await kv._write("KV_b", "$KV.b.k", "k", b"v", {}, expected=5)
        assert refused.value.extra["revision"] == 6
    finally:
        await kv.close()
