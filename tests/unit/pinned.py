"""Failing loudly when a pinned library changes what the gateway relies on (see
test_nats_internals.py and test_uvicorn_internals.py)."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Any

import pytest


class Pinned:
    """A library pinned to the release series ``tested``, whose private names ``users`` use."""

    def __init__(self, library: str, tested: str, users: str) -> None:
        self.library = library
        self.tested = tested
        self.installed = version(library)
        self.users = users

    def fail(self, what: str, how: str) -> None:
        pytest.fail(
            f"{self.library} {self.installed}: {what} {how}. The gateway relies on it as "
            f"{self.library} {self.tested} has it ({self.users}): adapt them to this release "
            f"before widening the {self.library} pin in pyproject.toml.",
            pytrace=False,
        )

    def require(self, condition: bool, what: str, how: str) -> None:
        if not condition:
            self.fail(what, how)

    def parameters(self, function: Any, expected: list[str], what: str, *, coroutine: bool) -> None:
        """``function`` exists, is (or is not) a coroutine function, and takes ``expected``."""
        if function is None:
            self.fail(what, "does not exist")
        self.require(
            inspect.iscoroutinefunction(function) == coroutine,
            what,
            "is no longer a coroutine function" if coroutine else "became a coroutine function",
        )
        names = list(inspect.signature(function).parameters)
        self.require(
            names == expected, what, f"takes ({', '.join(names)}), not ({', '.join(expected)})"
        )

    def source_uses(self, function: Any, fragment: str, what: str, why: str) -> None:
        """``function``'s source still contains ``fragment``."""
        self.require(
            fragment in inspect.getsource(function), what, f"no longer uses {fragment!r} ({why})"
        )
