"""NatsPool.wait and NatsPool.within: the later steps of one answer share its request timeout
(the end-to-end case is in tests/integration/test_kv_monotonic.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.config import Settings
from app.errors import Timeout
from app.metrics import Metrics
from app.nats.pool import NatsPool


def pool(timeout: float = 2.0) -> NatsPool:
    return NatsPool(Settings(request_timeout=timeout), ["nats://127.0.0.1:1"], Metrics())


def test_outside_an_answer_a_call_waits_its_own_timeout() -> None:
    p = pool()
    assert p.wait() == 2.0
    assert p.wait(7.5) == 7.5


def test_within_an_answer_a_call_waits_what_is_left_of_it() -> None:
    p = pool()
    with p.within(time.monotonic() - 1.5):
        assert 0.4 < p.wait() <= 0.5
        assert 0.4 < p.wait(30.0) <= 0.5  # a longer timeout of its own does not extend it
        assert p.wait(0.1) == 0.1  # a shorter one stands
    assert p.wait() == 2.0  # the block's end restores the caller's


def test_an_inner_answer_never_extends_the_outer_one() -> None:
    p = pool()
    with p.within(time.monotonic() - 1.5):
        with p.within(time.monotonic()):
            assert p.wait() <= 0.5
        with p.within(time.monotonic() - 1.9, timeout=2.0):
            assert p.wait() <= 0.1


def test_nothing_left_is_a_timeout_before_anything_is_sent() -> None:
    p = pool()
    with p.within(time.monotonic() - 2.5), pytest.raises(Timeout) as raised:
        p.wait()
    assert raised.value.code == "nats.timeout"


async def test_an_answer_is_its_own_task_s_alone() -> None:
    """Concurrent requests each keep their own answer's time (a context variable)."""
    p = pool()
    seen: dict[str, float] = {}

    async def answer(name: str, started: float) -> None:
        with p.within(started):
            await asyncio.sleep(0.01)
            seen[name] = p.wait()

    now = time.monotonic()
    await asyncio.gather(answer("late", now - 1.8), answer("fresh", now))
    assert seen["late"] < 0.2 < 1.9 < seen["fresh"] <= 2.0
