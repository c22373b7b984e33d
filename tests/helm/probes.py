"""A stand-in HTTP server on a free loopback port, to run probe commands against."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubServer:
    """Answers GET <path> with the status set in ``statuses`` (404 for other paths)."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {"/healthz": 200, "/readyz": 200}
        self.requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                stub.requests.append(self.path)
                status = stub.statuses.get(self.path, 404)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def stub_server() -> Iterator[StubServer]:
    server = StubServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run_probe(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run an exec probe / HEALTHCHECK command here, with this interpreter as `python`."""
    assert command[0] == "python", command
    done = subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, timeout=30, check=False
    )
    return done.returncode
