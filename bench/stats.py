"""Small helpers shared by the load processes."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(samples_ns: list[int]) -> dict[str, Any]:
    values = sorted(samples_ns)
    ms = 1e-6
    return {
        "count": len(values),
        "p50_ms": percentile(values, 50) * ms,
        "p90_ms": percentile(values, 90) * ms,
        "p99_ms": percentile(values, 99) * ms,
        "mean_ms": (sum(values) / len(values) * ms) if values else math.nan,
    }


def emit(result: dict[str, Any]) -> None:
    """The load process's result: one JSON line on stdout (the last line is read)."""
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()


def window(edge: str) -> None:
    """Tell the driver that the measured window starts or ends (``edge``): it reads the CPU
    counters then (bench/run.py ``Window``), so a warm-up is left out of CPU per operation."""
    sys.stdout.write(f"WINDOW {edge}\n")
    sys.stdout.flush()


def install_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover
        pass


async def closed_loop(
    op: Callable[[int], Awaitable[Any]], concurrency: int, duration: float, warmup: float
) -> dict[str, Any]:
    """``concurrency`` tasks each awaiting ``op(i)`` back to back; ops/s over ``duration``
    after ``warmup``. ``i`` walks over the integers, each task its own residue class."""
    state = {"measuring": False, "stop": False, "ok": 0, "errors": 0, "first_error": None}

    async def worker(start: int) -> None:
        i = start
        while not state["stop"]:
            try:
                await op(i)
            except Exception as exc:  # noqa: BLE001
                if state["measuring"]:
                    state["errors"] += 1
                    state["first_error"] = state["first_error"] or repr(exc)
            else:
                if state["measuring"]:
                    state["ok"] += 1
            i += concurrency

    tasks = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    await asyncio.sleep(warmup)
    window("start")
    state["measuring"] = True
    t0 = time.perf_counter()
    await asyncio.sleep(duration)
    ok, errors = state["ok"], state["errors"]
    elapsed = time.perf_counter() - t0
    window("end")
    state["measuring"] = False
    state["stop"] = True
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "ops": ok,
        "errors": errors,
        "first_error": state["first_error"],
        "seconds": elapsed,
        "rate": ok / elapsed,
        "concurrency": concurrency,
    }


async def sequential_latency(
    op: Callable[[int], Awaitable[Any]], duration: float, warmup: float
) -> dict[str, Any]:
    """One request at a time; per-request latency over ``duration`` after ``warmup``."""
    clock = time.perf_counter_ns
    i = 0
    end = time.monotonic() + warmup
    while time.monotonic() < end:
        await op(i)
        i += 1
    samples: list[int] = []
    window("start")
    end = time.monotonic() + duration
    while time.monotonic() < end:
        t0 = clock()
        await op(i)
        samples.append(clock() - t0)
        i += 1
    window("end")
    return latency_summary(samples)


def load_options(p: argparse.ArgumentParser) -> None:
    """The options every load process takes (the driver passes them to both kinds)."""
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--warmup", type=float, default=1)
