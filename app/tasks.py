"""Stopping the gateway's own background tasks, and running cleanups to their end.

``task.cancel()`` asks once, and a task can miss it: on Python 3.11, ``asyncio.wait_for``
(under nats-py's ``Subscription.next_msg``) returns the result of a future that completed in
the same turn of the loop as the cancel, and the cancel is dropped. The runner of a push
subscription deleted while messages flowed so kept running (it pulled again after its
back-off), and the gateway's shutdown waited for it forever: 31 of 100 subscriptions deleted
under a flood of messages, nats-py 2.16, Python 3.11.7.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any

from app import errors

log = logging.getLogger("jsgw.tasks")

RETRY = 0.5
"""Seconds between cancels of a task that has not ended yet: what the task does once
cancelled (an UNSUB, a consumer's delete, each queued at once) has this long before it is
cancelled again. A missed cancel is rare; a cleanup slowed by a busy connection is less so."""


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` until it has ended, and wait for that.

    A task that ends by cancellation or returns is done with; an exception it ends with is
    raised here. The caller's own cancellation is not swallowed (``await task`` under
    ``suppress(CancelledError)`` swallows it as well as the task's)."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=RETRY)
    if not task.cancelled():
        task.result()


# Cleanups started by run_to_end: held here until they end (the loop holds tasks weakly).
_RUNNING: set[asyncio.Task[Any]] = set()


def run_to_end(
    cleanup: Coroutine[Any, Any, None], *, context: contextvars.Context | None = None
) -> asyncio.Task[None]:
    """``cleanup`` (an UNSUB, a consumer's delete) in a task of its own, held until it ends:
    a caller cancelled meanwhile (its HTTP client went away) cannot stop it half-way. Its
    NATS errors are dropped (a consumer left behind expires after its inactive threshold);
    anything else is logged. ``context``: another than the caller's (its deadline, say)."""
    task = asyncio.get_running_loop().create_task(cleanup, context=context)
    _RUNNING.add(task)
    task.add_done_callback(_ended)
    return task


def _ended(task: asyncio.Task[Any]) -> None:
    _RUNNING.discard(task)
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, errors.GatewayError):
        log.warning("a cleanup failed", exc_info=error)
