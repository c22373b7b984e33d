"""NatsPool.wait and NatsPool.within: the later steps of one answer share its request timeout
(the end-to-end case is in tests/integration/test_kv_monotonic.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app import errors
from app.config import Settings
from app.errors import Timeout
from app.metrics import Metrics
from app.nats.pool import NatsPool
from app.nats.replies import LeanClient
from app.nats.scan import ConsumerScan

T = 60.0  # the request timeout: margins of seconds, whatever the machine's load


def pool(timeout: float = T) -> NatsPool:
    return NatsPool(Settings(request_timeout=timeout), ["nats://127.0.0.1:1"], Metrics())


def test_outside_an_answer_a_call_waits_its_own_timeout() -> None:
    p = pool()
    assert p.wait() == T
    assert p.wait(7.5) == 7.5


def test_within_an_answer_a_call_waits_what_is_left_of_it() -> None:
    p = pool()
    with p.within(time.monotonic() - 40):
        assert 15 < p.wait() <= 20
        assert 15 < p.wait(300.0) <= 20  # a longer timeout of its own does not extend it
        assert p.wait(0.1) == 0.1  # a shorter one stands
    assert p.wait() == T  # the block's end restores the caller's


def test_an_inner_answer_never_extends_the_outer_one() -> None:
    p = pool()
    with p.within(time.monotonic() - 40):
        with p.within(time.monotonic()):
            assert p.wait() <= 20
        with p.within(time.monotonic() - 50, timeout=T):
            assert p.wait() <= 10


def test_nothing_left_is_a_timeout_before_anything_is_sent() -> None:
    p = pool()
    with p.within(time.monotonic() - T - 1), pytest.raises(Timeout) as raised:
        p.wait()
    assert raised.value.code == "nats.timeout"


def timeouts(p: NatsPool, operation: str) -> float:
    value = p._metrics.registry.get_sample_value(
        "jsgw_nats_request_errors_total", {"operation": operation, "kind": "timeout"}
    )
    return value or 0.0


async def test_a_call_refused_for_lack_of_time_is_counted_as_its_operation_s_timeout() -> None:
    """The client gets the 504 a timeout gives: the error metric counts it as one, under
    the operation that was refused (nothing was sent)."""
    p = pool()
    with p.within(time.monotonic() - T - 1):
        with pytest.raises(Timeout):
            p.wait(operation="kv.get")
        with pytest.raises(Timeout):
            await p.request("$JS.API.DIRECT.GET.KV_B", operation="kv.get", client=Lean())
        with pytest.raises(Timeout):
            p.wait()  # a caller that counts its timeouts itself
    assert timeouts(p, "kv.get") == 2
    with p.within(time.monotonic()):
        p.wait(operation="kv.get")  # time left: nothing counted
    assert timeouts(p, "kv.get") == 2


class Lean(LeanClient):
    """A connection that is never used: the refusal comes before anything is sent."""

    def __init__(self) -> None:
        pass


async def test_an_answer_is_its_own_task_s_alone() -> None:
    """Concurrent requests each keep their own answer's time (a context variable)."""
    p = pool()
    seen: dict[str, float] = {}

    async def answer(name: str, started: float) -> None:
        with p.within(started):
            await asyncio.sleep(0.01)
            seen[name] = p.wait()

    now = time.monotonic()
    await asyncio.gather(answer("late", now - 50), answer("fresh", now))
    assert seen["late"] < 10 < 50 < seen["fresh"] <= T


class JetStream:
    """The JetStream API as the pool sends it: nothing is sent once the answer's time is
    spent (NatsPool.wait); what was sent is recorded."""

    def __init__(self, p: NatsPool) -> None:
        self.pool = p
        self.sent: list[tuple[str, ...]] = []

    async def call(self, operation: str, *tokens: str, **_: Any) -> dict[str, Any]:
        self.pool.wait()
        self.sent.append(tokens)
        return {"name": "SCAN", "num_pending": 0}


async def test_a_scan_whose_answer_ran_out_of_time_deletes_its_consumer_after_it() -> None:
    p = pool()
    js = JetStream(p)
    with p.within(time.monotonic() - T + 0.2):
        async with ConsumerScan(js, "KV_B", ["$KV.B.k"]):  # type: ignore[arg-type]
            await asyncio.sleep(0.3)  # the answer's time runs out meanwhile
            with pytest.raises(errors.Timeout):
                p.wait()
    assert js.sent == [("CONSUMER", "CREATE", "KV_B")]  # the delete could not be sent then
    await asyncio.sleep(0.05)
    assert js.sent[-1] == ("CONSUMER", "DELETE", "KV_B", "SCAN")  # after the answer
