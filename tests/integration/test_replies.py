"""The request/reply mux of pooled connections (app.nats.replies), against a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import nats.errors
import pytest

from app.nats.embedded import EmbeddedServer
from app.nats.replies import _TICK, LeanClient


@pytest.fixture
async def echo(lean: LeanClient, name: str) -> AsyncIterator[str]:
    """A responder on ``<name>.echo`` answering with its payload, subscribed on the requesting
    connection itself (its SUB then goes out before the requests, whatever nats-py's flush
    does: see test_a_subscription_flushed_in_order_is_seen_by_other_connections)."""

    async def answer(msg):  # type: ignore[no-untyped-def]
        await msg.respond(b"echo:" + msg.data)

    sub = await lean.subscribe(f"{name}.echo", cb=answer)
    await lean.flush_in_order(5)
    yield f"{name}.echo"
    await sub.unsubscribe()


async def test_requests_are_queued_directly_and_answered(lean: LeanClient, echo: str) -> None:
    sent_before = lean.stats["out_msgs"]
    replies = await asyncio.gather(
        *(lean.replies.request(echo, b"%d" % i, timeout=5) for i in range(200))
    )
    assert [r.data for r in replies] == [b"echo:%d" % i for i in range(200)]
    assert lean.stats["out_msgs"] - sent_before == 400  # the requests, and the echo's answers
    assert lean._pending == [] and lean._pending_data_size == 0  # all flushed
    assert lean.replies._pending == {}


async def test_publish_queued_declines_what_nats_py_must_handle(lean: LeanClient) -> None:
    inbox = lean.new_inbox()
    assert not lean.publish_queued("bad subject", inbox, b"")
    assert not lean.publish_queued("bad\r\nPUB x 1", inbox, b"")
    assert not lean.publish_queued("", inbox, b"")
    assert not lean.publish_queued("ok", inbox, b"x" * (lean.max_payload + 1))
    assert lean._pending == []
    # ... and nats-py's publish then raises its own errors.
    with pytest.raises(nats.errors.BadSubjectError):
        await lean.replies.request("bad subject", b"", timeout=1)
    with pytest.raises(nats.errors.MaxPayloadError):
        await lean.replies.request("ok", b"x" * (lean.max_payload + 1), timeout=1)
    assert lean.replies._pending == {}
    await lean.close()
    assert not lean.publish_queued("ok", inbox, b"")
    with pytest.raises(nats.errors.ConnectionClosedError):
        await lean.replies.request("ok", b"", timeout=1)


async def test_requests_with_headers_still_carry_them(lean: LeanClient, name: str) -> None:
    async def answer(msg):  # type: ignore[no-untyped-def]
        await msg.respond((msg.headers or {}).get("X-Test", "none").encode())

    sub = await lean.subscribe(f"{name}.hdr", cb=answer)
    await lean.flush_in_order(5)
    try:
        reply = await lean.replies.request(f"{name}.hdr", b"", 5, headers={"X-Test": "yes"})
        assert reply.data == b"yes"
    finally:
        await sub.unsubscribe()


async def test_no_responders_and_timeouts(lean: LeanClient, name: str) -> None:
    with pytest.raises(nats.errors.NoRespondersError):
        await lean.replies.request(f"{name}.nobody", b"", timeout=5)

    silent = await lean.subscribe(f"{name}.silent")  # takes requests, never answers
    await lean.flush_in_order(5)
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(lean.replies.request(f"{name}.silent", b"", timeout=0.3) for _ in range(5)),
            return_exceptions=True,
        )
        waited = time.monotonic() - started
        assert all(isinstance(r, nats.errors.TimeoutError) for r in results)
        # Deadlines are kept in buckets: never early, at most one bucket late (plus slack).
        assert 0.3 <= waited < 0.3 + _TICK + 0.5, waited
        assert lean.replies._pending == {}
        await asyncio.sleep(_TICK * 2)
        # The timed-out bucket is gone; the one of the 5 s request answered above is empty.
        assert [len(f) for f in lean.replies._deadlines.values()] == [0]
    finally:
        await silent.unsubscribe()


async def test_answered_requests_leave_no_deadline_behind(lean: LeanClient, echo: str) -> None:
    await asyncio.gather(*(lean.replies.request(echo, b"", timeout=1) for _ in range(50)))
    assert all(not futures for futures in lean.replies._deadlines.values())
    await asyncio.sleep(1 + _TICK * 2)
    assert lean.replies._deadlines == {}


async def test_request_all_shares_one_deadline(lean: LeanClient, echo: str, name: str) -> None:
    silent = await lean.subscribe(f"{name}.silent2")
    await lean.flush_in_order(5)
    try:
        results = await lean.replies.request_all(
            [(echo, b"a"), (f"{name}.silent2", b""), (f"{name}.nobody", b""), (echo, b"b")],
            timeout=0.5,
        )
    finally:
        await silent.unsubscribe()
    assert [getattr(r, "data", None) for r in results] == [b"echo:a", None, None, b"echo:b"]
    assert isinstance(results[1], nats.errors.TimeoutError)
    assert isinstance(results[2], nats.errors.NoRespondersError)
    assert lean.replies._pending == {}


async def test_request_batch_goes_out_whole_even_if_its_caller_is_cancelled(
    lean: LeanClient, name: str
) -> None:
    """The messages of a batch are queued together: the replies come back in order, and a
    caller cancelled while it waits (a client gone) has still sent every message."""
    seen: list[tuple[bytes, str | None]] = []

    async def answer(msg):  # type: ignore[no-untyped-def]
        seen.append((msg.data, (msg.headers or {}).get("Seq")))
        if msg.data != b"silent":
            await msg.respond(b"ok:" + msg.data)

    await lean.subscribe(f"{name}.batch", cb=answer)
    await lean.flush_in_order(5)
    messages = [(f"{name}.batch", {"Seq": str(i)}, b"%d" % i) for i in range(50)]
    replies = await lean.replies.request_batch(messages, timeout=5)
    assert [r.data if r else None for r in replies] == [b"ok:%d" % i for i in range(50)]
    assert [s for _, s in seen] == [str(i) for i in range(50)]

    seen.clear()
    silent = [*messages[:-1], (f"{name}.batch", {"Seq": "49"}, b"silent")]
    waiting = asyncio.ensure_future(lean.replies.request_batch(silent, timeout=5))
    await asyncio.sleep(0)  # queued: the caller now waits for the last reply
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await lean.flush_in_order(5)
    for _ in range(100):
        if len(seen) == 50:
            break
        await asyncio.sleep(0.01)
    assert [s for _, s in seen] == [str(i) for i in range(50)]
    assert lean.replies._pending == {}


async def test_request_batch_refuses_a_message_over_max_payload(
    lean: LeanClient, echo: str
) -> None:
    """Headers and payload together over max_payload: nothing queued (the server would
    close the connection), the connection stays up for the next request."""
    sent_before = lean.stats["out_msgs"]
    fits = (echo, {"A": "b"}, b"x" * (lean.max_payload - 100))
    over = (echo, {"A": "b" * 100}, b"x" * (lean.max_payload - 100))
    with pytest.raises(nats.errors.MaxPayloadError):
        await lean.replies.request_batch([fits, over], timeout=5)
    assert lean.stats["out_msgs"] == sent_before
    assert lean._pending == [] and lean.replies._pending == {}
    replies = await lean.replies.request_batch([fits], timeout=5)
    assert replies[0] is not None and replies[0].data == b"echo:" + fits[2]
    assert lean.is_connected


async def test_a_subscription_flushed_in_order_is_seen_by_other_connections(
    lean: LeanClient, nats_server: EmbeddedServer, name: str
) -> None:
    """After ``flush_in_order`` the server has the subscription: another connection's request
    right after it reaches the responder, every time. nats-py's own ``flush`` sends its PING
    ahead of the queued SUB, and so a request right after it got "no responders" in 50 of 300
    rounds (nats-py 2.16, nats-server 2.15.1)."""
    other = await nats.connect(nats_server.url)

    async def answer(msg):  # type: ignore[no-untyped-def]
        await msg.respond(b"here")

    try:
        for n in range(150):
            sub = await lean.subscribe(f"{name}.{n}", cb=answer)
            await lean.flush_in_order(5)
            assert (await other.request(f"{name}.{n}", b"", timeout=5)).data == b"here", n
            await sub.unsubscribe()
    finally:
        await other.close()
