"""Prints how many hostile requests the bad-input suite sent (issue 6 asks for the count)."""

from __future__ import annotations

import sys

import pytest

from tests.security.tally import WORKER_OUTPUT, Tally, report


def _tally() -> Tally | None:
    module = sys.modules.get("tests.security.test_hostile_inputs")
    return getattr(module, "TALLY", None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # In a process of a parallel run: handed to the controlling one, which prints it.
    output = getattr(session.config, "workeroutput", None)
    tally = _tally()
    if output is not None and tally is not None:
        output[WORKER_OUTPUT] = tally.as_output()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report(terminalreporter, _tally())
