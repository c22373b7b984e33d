"""Failing loudly when a pinned library changes what the gateway relies on (see
test_nats_internals.py and test_uvicorn_internals.py).

app/compat.py lists the private names and checks what can be checked without running them;
these tests add what only running them shows, and say what moved the way compat does."""

from __future__ import annotations

import pytest

from app.compat import Pin, problems


class Pinned:
    """A library pinned to a release series (``pin``), whose private names ``users`` use."""

    def __init__(self, pin: Pin, users: str) -> None:
        self.pin = pin
        self.users = users

    def fail(self, what: str, how: str) -> None:
        pytest.fail(
            f"{self.pin.problem(what, how, self.users)}. Adapt them to this release before "
            f"widening the {self.pin.distribution} pin in pyproject.toml.",
            pytrace=False,
        )

    def require(self, condition: bool, what: str, how: str) -> None:
        if not condition:
            self.fail(what, how)

    def in_tested_series(self) -> None:
        self.require(
            self.pin.in_tested_series,
            "the installed release",
            "is not in the series the gateway was tested with",
        )

    def nothing_moved(self) -> None:
        """app.compat's own checks of this library pass."""
        prefix = f"{self.pin.distribution} "
        moved = [line for line in problems() if line.startswith(prefix)]
        if moved:
            pytest.fail("\n".join(moved), pytrace=False)
