"""`jsgw serve` with no JSGW_NATS_URL runs its own nats-server and leaves none behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_named(pid: int, name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def start_gateway(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSGW_")}
    env.update({"JSGW_PORT": str(port), "JSGW_DATA_DIR": str(tmp_path / "data")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "gateway.log", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("gateway did not become ready: " + (tmp_path / "gateway.log").read_text())


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_embedded_server_starts_serves_and_stops(tmp_path: Path) -> None:
    proc, port = start_gateway(tmp_path, "serve")
    try:
        servers = children_named(proc.pid, "nats-server")
        assert len(servers) == 1
        base = f"http://127.0.0.1:{port}"
        info = httpx.get(f"{base}/v1/info").json()
        assert info["embedded"] is True
        created = httpx.put(f"{base}/v1/streams/EMB", json={"subjects": ["emb.>"]})
        assert created.status_code == 201
        assert httpx.post(f"{base}/v1/publish/emb.1", content=b"x").json()["seq"] == 1
        assert (tmp_path / "data" / "jetstream").is_dir()  # the store is under JSGW_DATA_DIR
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal as its exit status.
        assert proc.wait(20) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in (tmp_path / "gateway.log").read_text()
    assert wait_gone(servers[0]), "nats-server outlived the gateway"


def test_embedded_server_dies_with_a_killed_gateway(tmp_path: Path) -> None:
    proc, _ = start_gateway(tmp_path)
    servers = children_named(proc.pid, "nats-server")
    assert len(servers) == 1
    proc.kill()
    proc.wait(10)
    assert wait_gone(servers[0]), "nats-server was orphaned by a killed gateway"


def test_bad_settings_fail_at_start_with_a_clear_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSGW_")}
    env.update({"JSGW_POOL_SIZE": "0", "JSGW_NATS_URL": "http://x"})
    out = subprocess.run(
        [sys.executable, "-m", "app", "serve"], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "JSGW_POOL_SIZE" in out.stderr and "JSGW_NATS_URL" in out.stderr
