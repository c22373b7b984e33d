"""The delivery side of a watch, fed directly: the catch-up, the hand-over to the shared feed,
filtering, the ready marker, the bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import json

from app import errors
from app.kv.watch import (
    Watches,
    WatchEvent,
    WatchOptions,
    WatchSession,
    entry_event,
    entry_from_delivery,
)
from app.metrics import Metrics
from app.nats.direct import StoredMessage
from app.nats.scan import Delivery


def delivery(seq: int, key: str, pending: int, *, op: str | None = None) -> Delivery:
    headers = {"KV-Operation": op} if op else None
    return Delivery(
        f"$KV.B.{key}",
        seq,
        seq,
        pending,
        1_700_000_000_000_000_000 + seq,
        headers,
        b"" if op else f"v{seq}".encode(),
    )


def session(queue_size: int = 100, visible=None, **options: object) -> WatchSession:
    closed: list[WatchSession] = []
    return WatchSession(
        "B",
        WatchOptions(**options),
        queue_size=queue_size,  # type: ignore[arg-type]
        visible=visible,
        on_closed=closed.append,
    )


def feed(s: WatchSession, seq: int, key: str, *, op: str | None = None) -> None:
    """What the shared feed offers: one entry, encoded once for every session."""
    entry = entry_from_delivery("B", delivery(seq, key, 0, op=op), meta_only=s.options.meta_only)
    s.on_feed(entry, entry_event(entry))


async def drain(s: WatchSession) -> list[WatchEvent]:
    s.end()
    return [event async for event in s.events()]


async def test_ready_after_the_last_initial_message_even_when_it_is_filtered_out() -> None:
    s = session(ignore_deletes=True)
    s.on_start(num_pending=2, position=0)
    s.on_message(delivery(3, "a", 1))
    s.on_message(delivery(5, "b", 0, op="DEL"))  # not sent, but it ends the initial data
    s.on_message(delivery(6, "c", 0))  # the catch-up consumer is done: the feed sends this
    feed(s, 6, "c")
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("put", "3"), ("ready", "5"), ("put", "6")]
    entry = json.loads(events[0].data)
    assert entry == {
        "bucket": "B",
        "key": "a",
        "value": "djM=",
        "revision": 3,
        "created": "2023-11-14T22:13:20.000000003Z",
        "delta": 1,
        "operation": "PUT",
    }


async def test_ready_once_and_at_once_when_nothing_is_pending() -> None:
    s = session(meta_only=True)
    s.on_start(num_pending=0, position=41)
    feed(s, 42, "a")
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
    s.on_error(errors.StreamDeleted(detail="gone"))
    events = [event async for event in s.events()]
    assert [e.event for e in events] == ["ready", "error"]
    assert json.loads(events[1].data)["code"] == "kv.bucket_deleted"


async def test_feed_events_during_the_catch_up_follow_ready_without_repeats() -> None:
    s = session()
    s.on_start(num_pending=3, position=0)
    feed(s, 7, "b")  # the feed runs ahead while the catch-up is still sending
    s.on_message(delivery(2, "a", 2))
    feed(s, 8, "a")
    s.on_message(delivery(7, "b", 1))  # last_per_subject already sent b at 7
    s.on_message(delivery(8, "a", 0))  # ... and a at 8: ready at 8
    feed(s, 9, "c")
    s.on_message(delivery(9, "c", 0))  # the catch-up consumer, after ready: ignored
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [
        ("put", "2"),
        ("put", "7"),
        ("put", "8"),
        ("ready", "8"),
        ("put", "9"),
    ]


async def test_updates_only_is_live_at_the_feed_position() -> None:
    s = session(updates_only=True)
    s.live_from(41)
    feed(s, 42, "a", op="DEL")
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("ready", "41"), ("delete", "42")]
    assert events[1].wire == (
        b"event: delete\r\nid: 42\r\ndata: " + events[1].data.encode() + b"\r\n\r\n"
    )


async def test_a_backlog_longer_than_the_queue_ends_the_stream() -> None:
    s = session(queue_size=2)
    s.on_start(num_pending=5, position=0)
    for seq in (10, 11, 12):
        feed(s, seq, "k")
    events = [event async for event in s.events()]
    assert [e.event for e in events] == ["error"]
    assert json.loads(events[0].data)["code"] == "kv.watch_too_slow"


async def test_chunks_join_what_is_queued() -> None:
    s = session(updates_only=True)
    s.live_from(1)
    feed(s, 2, "a")
    first = await s.next_chunk()
    assert first is not None and first.count(b"\r\n\r\n") == 2  # ready and the put, one write
    s.end()
    assert await s.next_chunk() is None


async def test_a_resumed_watch_never_goes_back_behind_its_last_event_id() -> None:
    """A catch-up consumer on a replica behind the others (as after a partition) reports a
    position, and delivers revisions, older than the client's Last-Event-ID: the client gets
    neither again, and its next Last-Event-ID (the ready id) does not go backwards."""
    s = session(since=10)
    s.on_start(num_pending=0, position=5)
    feed(s, 8, "a")  # the feed, behind as well
    feed(s, 11, "b")
    feed(s, 11, "b")  # a revision offered twice is sent once
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("ready", "10"), ("put", "11")]

    s = session(since=10)
    s.on_start(num_pending=3, position=5)
    for seq in (9, 10, 12):
        s.on_message(delivery(seq, "a", 12 - seq if seq < 12 else 0))
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("put", "12"), ("ready", "12")]


def dropped(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("jsgw_kv_watches_dropped_total", {"reason": reason})
    assert value is not None
    return value


async def test_a_watch_cut_off_is_counted_once_by_why() -> None:
    """Too far behind (a full queue) or stuck in a send for too long: each cut-off watch is
    counted once, under its reason; the watches open and the cap are exported."""
    metrics = Metrics()
    no_nats = None  # (nothing here talks to NATS)
    watches = Watches(
        no_nats,  # type: ignore[arg-type]
        limit=5,
        queue_size=3,
        idle_heartbeat=1,
        retry_after=1,
        metrics=metrics,
    )
    assert metrics.registry.get_sample_value("jsgw_kv_watches_limit") == 5
    behind = WatchSession(
        "B",
        WatchOptions(),
        queue_size=3,
        visible=None,
        on_closed=lambda _: None,
        on_too_slow=watches._behind.inc,
    )
    behind.on_start(num_pending=10, position=0)
    for seq in range(1, 11):  # over the queue several times: counted once
        behind.on_message(delivery(seq, f"k{seq}", 10 - seq))
    assert behind.ended
    assert (dropped(metrics, "behind"), dropped(metrics, "stuck")) == (1, 0)

    stuck = session()
    watches._active.add(stuck)
    assert metrics.registry.get_sample_value("jsgw_kv_watches_open") == 1
    stuck.sending_since = 1.0
    stuck.writer = writer = asyncio.get_running_loop().create_task(asyncio.sleep(10))
    watches._cut_off_stuck(now=1.0 + watches.send_timeout + 1)
    watches._cut_off_stuck(now=1.0 + watches.send_timeout + 2)  # the writer is going
    assert stuck.ended and stuck.cut_off
    with contextlib.suppress(asyncio.CancelledError):
        await writer
    assert (dropped(metrics, "behind"), dropped(metrics, "stuck")) == (1, 1)


class Leader:
    """The stream leader's messages of bucket B, as ``STREAM.MSG.GET`` with next_by_subj
    (the filter is every key here) answers them; the sequences asked are recorded."""

    def __init__(
        self,
        *keys_at: tuple[int, str],
        error: errors.GatewayError | None = None,
        held: bool = False,
    ):
        self.messages = {
            seq: StoredMessage("KV_B", f"$KV.B.{key}", seq, "2026-11-27T00:00:00Z", {}, b"L")
            for seq, key in keys_at
        }
        self.asked: list[int] = []
        self.subjects: list[str] = []  # the filter each read was asked in
        self.behind: list[bool] = []  # the session's on_replica_behind calls
        self.error = error
        # ``held``: each answer waits until this is set (a read in flight)
        self.answer = asyncio.Event()
        if not held:
            self.answer.set()

    async def next(self, stream: str, subject: str, seq: int) -> StoredMessage | None:
        assert stream == "KV_B", stream
        self.subjects.append(subject)
        await self.answer.wait()
        self.asked.append(seq)
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        return next((self.messages[s] for s in sorted(self.messages) if s >= seq), None)


def checked(leader: Leader, *, joined: int, **options: object) -> WatchSession:
    s = WatchSession(
        "B",
        WatchOptions(**options),
        queue_size=100,
        visible=None,
        on_closed=lambda _: None,
        leader_next=leader.next,
        on_replica_behind=lambda: leader.behind.append(True),
    )
    s.joined = joined
    return s


async def until_ready(s: WatchSession) -> None:
    while s._checking is not None:
        await asyncio.sleep(0)


async def test_a_catch_up_on_a_replica_behind_is_completed_from_the_leader() -> None:
    """The client resumes after 55; the feed it joins is at 58; its catch-up consumer lands
    on a replica that lacks 56..58 (committed by the leader just before a partition) and
    finds nothing pending. Those three come from the leader, in order, before ready."""
    leader = Leader((56, "a"), (57, "b"), (58, "a"), (60, "z"))
    s = checked(leader, joined=58, since=55)
    s.on_start(num_pending=0, position=58)  # the replica's "nothing after 55"
    feed(s, 59, "c")  # the feed goes on meanwhile
    s.on_message(delivery(56, "late", 0))  # the catch-up is no longer listened to
    await until_ready(s)
    feed(s, 60, "z")
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [
        ("put", "56"),
        ("put", "57"),
        ("put", "58"),
        ("ready", "58"),
        ("put", "59"),
        ("put", "60"),
    ]
    assert json.loads(events[0].data)["value"] == "TA=="  # the leader's message
    assert leader.asked == [56, 57, 58, 59]
    assert leader.behind == [True]  # one watch completed from the leader: counted once


async def test_nothing_in_the_filter_up_to_the_claim_costs_one_leader_read() -> None:
    leader = Leader((70, "a"))  # the next one in the filter is past the claim
    s = checked(leader, joined=64, since=40, key_filter="a")
    s.on_start(num_pending=0, position=64)
    await until_ready(s)
    assert [(e.event, e.id) for e in await drain(s)] == [("ready", "64")]
    assert leader.asked == [41]
    assert leader.subjects == ["$KV.B.a"]  # the session's own filter
    assert leader.behind == []  # the catch-up lacked nothing


async def test_a_catch_up_that_delivered_through_the_join_is_believed() -> None:
    leader = Leader((3, "a"))
    s = checked(leader, joined=3)
    s.on_start(num_pending=2, position=0)
    s.on_message(delivery(2, "b", 1))
    s.on_message(delivery(3, "a", 0))
    assert s._checking is None
    assert [(e.event, e.id) for e in await drain(s)] == [("put", "2"), ("put", "3"), ("ready", "3")]
    assert leader.asked == []


async def test_a_leader_that_cannot_be_asked_ends_the_watch_for_the_client_to_resume() -> None:
    unavailable = errors.Unavailable(errors.ErrorCode.NATS_UNAVAILABLE, "no leader")
    s = checked(Leader(error=unavailable), joined=58, since=55)
    s.on_start(num_pending=0, position=58)
    events = [event async for event in s.events()]  # the stream ends by itself
    assert [e.event for e in events] == ["error"]
    assert json.loads(events[0].data)["code"] == "nats.unavailable"


async def test_leader_entries_honour_meta_only_and_ignore_deletes() -> None:
    leader = Leader((5, "a"), (6, "b"))
    leader.messages[6].headers["KV-Operation"] = "DEL"
    s = checked(leader, joined=6, since=4, meta_only=True, ignore_deletes=True)
    s.on_start(num_pending=0, position=6)
    await until_ready(s)
    events = await drain(s)
    assert [(e.event, e.id) for e in events] == [("put", "5"), ("ready", "6")]
    assert "value" not in json.loads(events[0].data)


async def test_a_watch_closed_during_the_leader_read_stops_it() -> None:
    leader = Leader((5, "a"), held=True)
    s = checked(leader, joined=5, since=4)
    s.on_start(num_pending=0, position=5)
    checking = s._checking
    assert checking is not None
    await asyncio.sleep(0.01)  # the read is asked and waits
    await s.close()
    await asyncio.sleep(0)
    assert checking.cancelled()
    assert leader.asked == []  # its answer never came


class Catchup:
    """A catch-up consumer as the session sees it: where its server stood, and its stop."""

    def __init__(self, holds: int) -> None:
        self.holds = holds
        self.closed = False

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def test_a_catch_up_on_the_stream_leader_is_believed_up_to_what_the_leader_held() -> None:
    """Filtered on key a (revision 4) while another key is at 5: the catch-up's server led
    the stream at 5 when it was made, so nothing in the filter lies in (4, 5]."""
    leader = Leader((4, "a"), (5, "b"))
    s = checked(leader, joined=5, key_filter="a")
    released: list[bool] = []
    await s.catch_up(Catchup(holds=5), lambda: released.append(True))  # type: ignore[arg-type]
    s.on_message(delivery(4, "a", 0))
    assert s._checking is None and leader.asked == []
    assert [(e.event, e.id) for e in await drain(s)] == [("put", "4"), ("ready", "4")]
    await asyncio.sleep(0)  # (the catch-up is stopped in a task of its own)
    assert released == [True]


async def test_the_catch_up_s_slot_is_held_until_the_leader_has_answered() -> None:
    """A replica behind sends its watches to the leader: they stay within catchup_limit."""
    leader = Leader((5, "a"), held=True)
    s = checked(leader, joined=5, since=4)
    released: list[bool] = []
    catchup = Catchup(holds=0)
    await s.catch_up(catchup, lambda: released.append(True))  # type: ignore[arg-type]
    s.on_start(num_pending=0, position=5)
    await asyncio.sleep(0.01)
    assert catchup.closed and released == []  # its consumer is gone, its slot is not
    leader.answer.set()
    await until_ready(s)
    await asyncio.sleep(0)
    assert released == [True]
    assert [(e.event, e.id) for e in await drain(s)] == [("put", "5"), ("ready", "5")]


async def test_a_bucket_deleted_during_the_leader_read_is_a_deleted_bucket() -> None:
    gone = errors.StreamNotFound(detail="stream not found")
    s = checked(Leader(error=gone), joined=58, since=55)
    s.on_start(num_pending=0, position=58)
    events = [event async for event in s.events()]
    assert [e.event for e in events] == ["error"]
    assert json.loads(events[0].data)["code"] == "kv.bucket_deleted"
