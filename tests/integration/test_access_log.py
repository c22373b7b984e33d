"""The access log of a real ``python -m app serve`` (defaults: access log on, level info) with
two workers sharing one stderr pipe: every request sent has its line, with the fields and
formats of the access log, whole (lines long enough that two of them do not fit one PIPE_BUF
write), and none is lost when the gateway is stopped with SIGTERM right after the last
answer."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson

from app.nats.embedded import EmbeddedServer

CLIENTS = 4
PER_CLIENT = 60
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
CHECKOUT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _requests(port: int, client: int) -> list[tuple[str, str, int, str]]:
    """(request id, path, status, client address) of each request sent, each on a new
    connection (so that the kernel spreads them over both workers)."""
    sent = []
    for i in range(PER_CLIENT):
        request_id = f"t{client}-{i}"
        # Every other path is long: its line (the path twice) is over half of PIPE_BUF.
        path = f"/v1/kv/nobucket/keys/{'k' * (1200 if i % 2 else 8)}{i}"
        if i % 3 == 0:
            path = "/v1/info"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = f"GET {path} HTTP/1.1\r\nHost: gw\r\nX-Request-ID: {request_id}\r\n"
            sock.sendall(head.encode() + b"Connection: close\r\n\r\n")
            host, local = sock.getsockname()
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        status = int(answer.split(b" ", 2)[1])
        assert f"x-request-id: {request_id}\r\n".encode() in answer.lower(), answer
        sent.append((request_id, path, status, f"{host}:{local}"))
    return sent


def test_every_request_has_its_whole_line_after_sigterm(
    nats_server: EmbeddedServer, tmp_path: Path
) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSGW_")}
    env.update(
        PYTHONPATH=str(CHECKOUT),
        JSGW_NATS_URL=nats_server.url,
        JSGW_PORT=str(port),
        JSGW_WORKERS="2",
        JSGW_ACK_SECRET="access-log-test-secret-0123456789abcdef",
        JSGW_DATA_DIR=str(tmp_path / "data"),
        TMPDIR=str(tmp_path),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve"],
        env=env,
        cwd=CHECKOUT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # a pipe, as a container runtime gives
        start_new_session=True,  # its workers in its process group, to stop them all
    )
    assert proc.stderr is not None
    output = bytearray()
    reader = threading.Thread(target=lambda: output.extend(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, output.decode()
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        with ThreadPoolExecutor(CLIENTS) as pool:
            sent = [r for rs in pool.map(_requests, [port] * CLIENTS, range(CLIENTS)) for r in rs]
        proc.send_signal(signal.SIGTERM)  # at once: the last lines are still buffered
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    entries = [orjson.loads(line) for line in output.splitlines()]  # every line whole
    access = {e["request_id"]: e for e in entries if e["logger"] == "jsgw.access"}
    assert len(access) == len([e for e in entries if e["logger"] == "jsgw.access"])
    for request_id, path, status, client in sent:
        entry = access.pop(request_id)
        route = "/v1/info" if path == "/v1/info" else "/v1/kv/{bucket}/keys/{key}"
        assert list(entry) == [
            "ts",
            "level",
            "logger",
            "msg",
            "request_id",
            "method",
            "path",
            "route",
            "status",
            "duration_ms",
            "client",
        ]
        assert TS.fullmatch(entry["ts"]), entry["ts"]
        assert (entry["level"], entry["msg"]) == ("info", f"GET {path} {status}")
        assert (entry["method"], entry["path"], entry["route"]) == ("GET", path, route)
        assert (entry["status"], entry["client"]) == (status, client)
        assert isinstance(entry["duration_ms"], float) and entry["duration_ms"] >= 0
    # What is left: the readiness polls.
    assert {entry["path"] for entry in access.values()} <= {"/readyz"}, access
    assert {s for _, _, s, _ in sent} >= {200, 404}
