"""The delivery side of a watch, fed directly: filtering, the ready marker, the bounded queue."""

from __future__ import annotations

import json

from app import errors
from app.nats.scan import Delivery
from app.services.kv_watch import WatchEvent, WatchOptions, WatchSession


def delivery(seq: int, key: str, pending: int, *, op: str | None = None) -> Delivery:
    headers = {"KV-Operation": op} if op else None
    return Delivery(f"$KV.B.{key}", seq, seq, pending, 1_700_000_000_000_000_000 + seq, headers,
                    b"" if op else f"v{seq}".encode())


def session(queue_size: int = 100, visible=None, **options: object) -> WatchSession:
    closed: list[WatchSession] = []
    return WatchSession("B", WatchOptions(**options), queue_size=queue_size,  # type: ignore[arg-type]
                        visible=visible, on_closed=closed.append)


async def drain(s: WatchSession) -> list[WatchEvent]:
    s.end()
    return [event async for event in s.events()]


async def test_ready_after_the_last_initial_message_even_when_it_is_filtered_out() -> None:
    s = session(ignore_deletes=True)
    s.on_start(num_pending=2, position=0)
    s.on_message(delivery(3, "a", 1))
    s.on_message(delivery(5, "b", 0, op="DEL"))  # not sent, but it ends the initial data
    s.on_message(delivery(6, "c", 0))
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("put", "3"), ("ready", "5"), ("put", "6")]
    entry = json.loads(events[0].data)
    assert entry == {"bucket": "B", "key": "a", "value": "djM=", "revision": 3,
                     "created": "2023-11-14T22:13:20.000000003Z", "delta": 1, "operation": "PUT"}


async def test_ready_once_and_at_once_when_nothing_is_pending() -> None:
    s = session(meta_only=True)
    s.on_start(num_pending=0, position=41)
    s.on_message(delivery(42, "a", 0))
    s.on_start(num_pending=0, position=42)  # a re-created consumer: no second ready
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("ready", "41"), ("put", "42")]
    assert "value" not in json.loads(events[1].data)


async def test_keys_the_client_may_not_read_are_left_out() -> None:
    s = session(visible=lambda key: not key.startswith("secret"))
    s.on_start(num_pending=2, position=0)
    s.on_message(delivery(1, "secret.x", 1))
    s.on_message(delivery(2, "public", 0))
    assert [e.id for e in await drain(s)] == ["2", "2"]


async def test_a_full_queue_ends_the_stream_with_an_error() -> None:
    s = session(queue_size=3)
    s.on_start(num_pending=10, position=0)
    for seq in range(1, 11):
        s.on_message(delivery(seq, f"k{seq}", 10 - seq))
    events = [event async for event in s.events()]  # the stream ends by itself
    assert [e.event for e in events] == ["error"]  # the backlog was dropped, not kept
    assert json.loads(events[0].data)["code"] == "kv.watch_too_slow"


async def test_a_deleted_stream_is_a_deleted_bucket() -> None:
    s = session()
    s.on_start(num_pending=0, position=0)
    s.on_error(errors.NotFound("stream.deleted", "gone"))
    events = [event async for event in s.events()]
    assert [e.event for e in events] == ["ready", "error"]
    assert json.loads(events[1].data)["code"] == "kv.bucket_deleted"
