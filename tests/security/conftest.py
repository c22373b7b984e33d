"""Prints how many hostile requests the bad-input suite sent (issue 6 asks for the count)."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    module = sys.modules.get("tests.security.test_hostile_inputs")
    tally = getattr(module, "TALLY", None)
    if tally is None or not (tally.executed or tally.auth_executed):
        return
    statuses = ", ".join(f"{s}: {len(ids)}" for s, ids in sorted(tally.statuses.items()))
    terminalreporter.write_sep("-", "hostile inputs")
    terminalreporter.write_line(
        f"{tally.executed} hostile requests without auth ({statuses}); "
        f"{tally.auth_executed} with auth on"
    )
    if terminalreporter.verbosity > 0:  # which requests got something else than a 400
        for status, ids in sorted(tally.statuses.items()):
            if status != 400:
                for case_id in ids:
                    terminalreporter.write_line(f"  {status} {case_id}")
