"""What the bad-input suite sent (issue 6 asks for the count), and its summary line.

A serial run prints the tally of tests/security/test_hostile_inputs.py from that module; a
parallel run (`make test`) from what the process that ran it handed back (tests/conftest.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

WORKER_OUTPUT = "hostile_tally"  # its key in an xdist worker's output


@dataclass
class Tally:
    """What ran, for the summary line."""

    executed: int = 0
    auth_executed: int = 0
    statuses: dict[int, list[str]] = field(default_factory=dict)  # case ids by status

    def as_output(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_output(cls, output: dict[str, Any]) -> Tally:
        statuses = {int(status): list(ids) for status, ids in output["statuses"].items()}
        return cls(output["executed"], output["auth_executed"], statuses)


def report(terminalreporter: pytest.TerminalReporter, tally: Tally | None) -> None:
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
