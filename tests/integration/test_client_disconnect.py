"""A client that disconnects in the middle of its request body is an ordinary event: one line
at info, no error and no traceback (through the lean paths and through FastAPI alike)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from app.logs import JsonFormatter
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway


class Captured(logging.Handler):
    """The gateway's and uvicorn's log lines, as the JSON the gateway writes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict] = []
        self._records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Once, if it propagates to a second logger handled here.
        if not any(seen is record for seen in self._records[-8:]):
            self._records.append(record)
            self.lines.append(orjson.loads(self.format(record)))


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    loggers = [logging.getLogger(name) for name in ("jsgw", "uvicorn", "asyncio", "")]
    level = loggers[0].level
    loggers[0].setLevel(logging.INFO)  # as `jsgw serve` runs by default (JSGW_LOG_LEVEL)
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        loggers[0].setLevel(level)


@pytest.fixture(scope="module")
def base_url(nats_server: EmbeddedServer) -> Iterator[str]:
    with served_gateway(gateway_settings(nats_server.url)) as url:
        yield url


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("PUT", "/v1/kv/{name}/keys/k", None),  # the lean write
        ("PUT", "/v1/kv/{name}/keys/k?ttl=5s", None),  # the same route through FastAPI
        ("POST", "/v1/publish/{name}.a", None),  # the lean publish
        ("POST", "/v1/publish", "application/json"),  # a JSON body parsed by FastAPI
        ("PUT", "/v1/streams/{name}", "application/json"),
    ],
)
def test_a_body_cut_short_is_one_info_line(
    base_url: str, captured: Captured, name: str, method: str, path: str, content_type: str | None
) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    head = f"{method} {path.format(name=name)} HTTP/1.1\r\nHost: gateway\r\n"
    head += "Content-Length: 100000\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + b"{" * 1000)
        time.sleep(0.2)  # the request is being read when the client goes
    deadline = time.monotonic() + 5
    while not any("disconnected" in line["msg"] for line in captured.lines):
        assert time.monotonic() < deadline, captured.lines
        time.sleep(0.02)
    time.sleep(0.2)  # anything logged after it
    lines = [line for line in captured.lines if line["logger"] != "jsgw.access"]
    assert len(lines) == 1, lines
    (line,) = lines
    assert line["level"] == "info", line
    assert "exc" not in line, line
    assert line["request_id"]
    assert line["msg"].startswith(f"{method} {path.format(name=name).partition('?')[0]}: ")
