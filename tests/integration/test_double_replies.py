"""Writes answered twice (ReplyMux.request_write): a refusal is believed only when nothing
contradicts it.

After a partition heals, a deposed stream leader and the new one can both answer one publish:
the first refuses it against its stale state, the second stores and acknowledges it. Here two
core-NATS responders play those parts on the requesting connection, in either order, so the
mux's handling is exercised exactly; tests/faults/test_partitions.py makes the real thing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import nats.errors
import pytest

from app.nats.replies import LeanClient
from app.publish.service import acknowledged

REFUSAL = json.dumps(
    {"error": {"code": 400, "err_code": 10071, "description": "wrong last sequence: 7"}}
).encode()
ACK = b'{"stream":"KV_x","seq":8}'
DUPLICATE = b'{"stream":"KV_x","seq":8,"duplicate":true}'

Answer = Callable[[int], Awaitable[bytes | None]]  # attempt number -> reply (None: silent)


async def responders(lean: LeanClient, subject: str, *answers: Answer) -> list[list[bytes]]:
    """Each answer function as a responder of its own on ``subject``; returns what each got."""
    received: list[list[bytes]] = []
    for answer in answers:
        got: list[bytes] = []
        received.append(got)

        async def respond(msg, answer=answer, got=got):  # type: ignore[no-untyped-def]
            got.append(msg.data)
            reply = await answer(len(got))
            if reply is not None:
                await msg.respond(reply)

        await lean.subscribe(subject, cb=respond)
    await lean.flush_in_order(5)
    return received


def after(seconds: float, reply: bytes | None) -> Answer:
    async def answer(_attempt: int) -> bytes | None:
        await asyncio.sleep(seconds)
        return reply

    return answer


async def write(lean: LeanClient, subject: str, *, resend: bool, grace: float = 0.2):  # type: ignore[no-untyped-def]
    return await lean.replies.request_write(
        subject, b"v", 2.0, None, acknowledged, grace=grace, resend=resend
    )


@pytest.mark.parametrize("resend", [False, True])
async def test_a_pubAck_after_a_refusal_wins(lean: LeanClient, name: str, resend: bool) -> None:
    subject = f"{name}.w"
    await responders(lean, subject, after(0, REFUSAL), after(0.02, ACK))
    reply = await write(lean, subject, resend=resend)
    assert reply.data == ACK
    assert lean.replies.extra_replies["second"] >= 1


async def test_a_refusal_after_a_pubAck_is_counted_not_believed(
    lean: LeanClient, name: str
) -> None:
    subject = f"{name}.w"
    await responders(lean, subject, after(0.02, REFUSAL), after(0, ACK))
    seconds: list[str] = []
    lean.replies.on_extra_reply = seconds.append
    reply = await write(lean, subject, resend=False)
    assert reply.data == ACK
    for _ in range(50):
        if seconds:
            break
        await asyncio.sleep(0.01)
    assert seconds == ["second"]
    assert not lean.replies._writes  # nothing left behind


async def test_a_resent_write_found_stored_is_its_duplicate_pubAck(
    lean: LeanClient, name: str
) -> None:
    """Only a stale responder answers the first attempt; the copy is answered as the stream
    answers a duplicate Nats-Msg-Id: stored, with the sequence it was stored at."""
    subject = f"{name}.w"

    async def stale_then_dedup(attempt: int) -> bytes:
        return REFUSAL if attempt == 1 else DUPLICATE

    got = await responders(lean, subject, stale_then_dedup)
    reply = await write(lean, subject, resend=True)
    assert reply.data == DUPLICATE
    assert got == [[b"v", b"v"]]


async def test_a_refusal_nothing_contradicts_stands_after_the_grace(
    lean: LeanClient, name: str
) -> None:
    subject = f"{name}.w"
    got = await responders(lean, subject, after(0, REFUSAL))
    loop = asyncio.get_running_loop()
    started = loop.time()
    reply = await write(lean, subject, resend=True, grace=0.2)
    assert reply.data == REFUSAL
    assert 0.2 <= loop.time() - started < 1.0
    assert got == [[b"v", b"v"]]  # confirmed by sending it again
    assert lean.replies.extra_replies["second"] == 0


async def test_an_unanswered_copy_leaves_the_outcome_unknown(lean: LeanClient, name: str) -> None:
    subject = f"{name}.w"

    async def refuse_once(attempt: int) -> bytes | None:
        return REFUSAL if attempt == 1 else None

    await responders(lean, subject, refuse_once)
    with pytest.raises(nats.errors.TimeoutError):
        await lean.replies.request_write(
            subject, b"v", 0.3, None, acknowledged, grace=0.1, resend=True
        )


def test_acknowledged_tells_pubAcks_from_refusals() -> None:
    from app.nats.replies import Reply

    assert acknowledged(Reply(None, ACK))
    assert acknowledged(Reply(None, b'{"stream":"error","seq":1}'))
    assert not acknowledged(Reply(None, REFUSAL))
    assert not acknowledged(Reply(b"NATS/1.0 503\r\n\r\n", b""))
