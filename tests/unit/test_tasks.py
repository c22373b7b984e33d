"""app.tasks.cancel_and_wait: a task that misses one cancel is still stopped."""

from __future__ import annotations

import asyncio
import sys

import pytest

from app.tasks import cancel_and_wait


async def test_a_task_that_misses_the_cancel_is_cancelled_again() -> None:
    # On Python 3.11, asyncio.wait_for returns a result that came in the same turn of the loop
    # as the cancel and drops the cancel (nats-py's next_msg waits so): the task goes on.
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[int] = loop.create_future()
    turns = 0

    async def reader() -> None:
        nonlocal turns
        await asyncio.wait_for(arrived, 10)
        while True:  # what the task does next, e.g. wait for the next message
            turns += 1
            await asyncio.sleep(0.01)

    task = loop.create_task(reader())
    await asyncio.sleep(0)
    arrived.set_result(1)
    task.cancel()
    await asyncio.wait_for(cancel_and_wait(task), 2)
    assert task.cancelled()
    if sys.version_info < (3, 12):  # (3.12's wait_for no longer drops it)
        assert turns >= 1  # it did miss the first cancel


async def test_an_exception_the_task_ended_with_is_raised() -> None:
    async def failing() -> None:
        raise ValueError("boom")

    task = asyncio.get_running_loop().create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait(task)


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    stubborn_until = asyncio.Event()

    async def stubborn() -> None:
        while not stubborn_until.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # misses every cancel until told

    loop = asyncio.get_running_loop()
    task = loop.create_task(stubborn())
    stopper = loop.create_task(cancel_and_wait(task))
    await asyncio.sleep(0.25)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
    stubborn_until.set()
    await cancel_and_wait(task)


async def test_none_and_a_finished_task_are_done_with() -> None:
    await cancel_and_wait(None)

    async def quick() -> int:
        return 1

    task = asyncio.get_running_loop().create_task(quick())
    await task
    await cancel_and_wait(task)
