"""The access log writer (app.accesslog): the line is the one logging wrote, lines reach the
descriptor whole (on a pipe in writes of at most PIPE_BUF), a reader that stalls costs dropped
lines (counted), not a blocked event loop, and the log level still decides."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from app.accesslog import PIPE_BUF, AccessLog
from app.logs import JsonFormatter
from app.metrics import Metrics
from app.middleware import RequestContextMiddleware


def _old_line(now_us: int, fields: dict[str, object]) -> bytes:
    """What the middleware wrote through logging before (app.logs.JsonFormatter)."""
    record = logging.getLogger("jsgw.access").makeRecord(
        "jsgw.access",
        logging.INFO,
        __file__,
        1,
        "%s %s %s",
        (fields["method"], fields["path"], fields["status"]),
        None,
        extra=fields,
    )
    record.created = now_us / 1e6
    return JsonFormatter().format(record).encode()


def _typed(entry: dict[str, object]) -> list[tuple[str, type, object]]:
    return [(key, type(value), value) for key, value in entry.items()]


@pytest.mark.parametrize(
    "fields",
    [
        {
            "request_id": "3f9a1c0e5b7d2a4c6e8f0a1b00000001",
            "method": "GET",
            "path": "/v1/kv/orders/keys/customer.1234",
            "route": "/v1/kv/{bucket}/keys/{key}",
            "status": 200,
            "duration_ms": 0.417,
            "client": "127.0.0.1:51234",
        },
        {  # no client (a unix socket), text JSON must escape, a whole-millisecond duration
            "request_id": "caller:id/1+2=3",
            "method": "PUT",
            "path": '/v1/kv/b/keys/a"quote\\back\u00e9\u2028',
            "route": "<unmatched>",
            "status": 404,
            "duration_ms": 12.0,
            "client": None,
        },
    ],
)
@pytest.mark.parametrize("now_us", [1_764_131_000_123_456, 1_764_131_059_999_001])
def test_the_line_is_the_logging_line(fields: dict[str, object], now_us: int) -> None:
    access = AccessLog()
    line = access.line(now_us, **fields)  # type: ignore[arg-type]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    new, old = orjson.loads(line), orjson.loads(_old_line(now_us, fields))
    assert _typed(new) == _typed(old)  # same keys in the same order, same values and types
    assert new["ts"].endswith(f".{now_us % 1_000_000:06d}Z")


def test_the_timestamp_keeps_its_microseconds_at_a_whole_second() -> None:
    # (isoformat, which the logging path used, leaves them out when they are 0.)
    line = AccessLog().line(1_764_131_000_000_000, "i", "GET", "/", "/", 200, 1.0, None)
    assert orjson.loads(line)["ts"] == "2025-11-26T04:23:20.000000Z"


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)


def _drain(fd: int, into: bytearray) -> threading.Thread:
    def run() -> None:
        while chunk := os.read(fd, 1 << 16):
            into.extend(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _line(access: AccessLog, i: int, path_length: int) -> bytes:
    path = "/v1/kv/b/keys/" + "k" * path_length
    return access.line(time.time_ns() // 1000, f"id-{i}", "GET", path, "/r", 200, 0.5, None)


def test_lines_reach_a_pipe_whole_in_writes_of_at_most_pipe_buf(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    read, write = pipe
    writes: list[bytes] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes) -> int:
        if fd == write:
            writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    received = bytearray()
    reader = _drain(read, received)
    access = AccessLog(write)
    long_line = _line(access, -1, 6000)  # longer than PIPE_BUF: written alone

    async def log() -> None:
        access.start()
        for i in range(3000):
            access.write(_line(access, i, (i * 37) % 1500))
            if i == 1000:
                access.write(long_line)
            if i % 50 == 0:
                await asyncio.sleep(0.002)  # the loop turns: timers hand batches over

    asyncio.run(log())
    access.close()
    os.close(write)
    reader.join(10)
    lines = bytes(received).splitlines(keepends=True)
    assert len(lines) == 3001
    assert [orjson.loads(line)["request_id"] for line in lines if line != long_line] == [
        f"id-{i}" for i in range(3000)
    ]
    assert all(w.endswith(b"\n") for w in writes)  # whole lines only
    assert all(len(w) <= PIPE_BUF for w in writes if w != long_line)
    assert long_line in writes
    assert len(writes) < len(lines)  # several lines in a write


def test_a_stalled_reader_costs_dropped_lines_not_a_blocked_loop(pipe: tuple[int, int]) -> None:
    read, write = pipe
    drops: list[int] = []
    access = AccessLog(write, on_drop=lambda: drops.append(1), max_pending=256 * 1024)
    count = 5000  # about 1 MB of lines: far more than the pipe (64 KiB) and the bound hold

    async def log() -> float:
        access.start()
        started = time.monotonic()
        for i in range(count):
            access.write(_line(access, i, 150))
            if i % 100 == 0:
                await asyncio.sleep(0.001)
        return time.monotonic() - started

    took = asyncio.run(log())
    assert took < 2.0, took  # nobody reads the pipe, and the loop went on
    assert access.dropped > 0 and len(drops) == access.dropped
    received = bytearray()
    reader = _drain(read, received)  # now the reader comes back: what was kept arrives
    access.close()
    os.close(write)
    reader.join(10)
    lines = bytes(received).splitlines()
    assert len(lines) + access.dropped == count
    assert all(orjson.loads(line)["logger"] == "jsgw.access" for line in lines)


async def test_the_log_level_decides(pipe: tuple[int, int]) -> None:
    read, write = pipe
    os.set_blocking(read, False)

    async def answer(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    async def ignore(message: object) -> None:
        pass

    async def nothing() -> dict[str, object]:
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "DELETE",
        "path": "/x",
        "headers": [(b"x-request-id", b"req-1")],
        "client": ("192.0.2.7", 4000),
    }
    middleware = RequestContextMiddleware(answer, Metrics(), AccessLog(write))
    jsgw = logging.getLogger("jsgw")
    level = jsgw.level
    try:
        jsgw.setLevel(logging.WARNING)  # JSGW_LOG_LEVEL=warning: no access lines
        await middleware(dict(scope), nothing, ignore)
        with pytest.raises(BlockingIOError):
            os.read(read, 1 << 16)
        jsgw.setLevel(logging.INFO)
        await middleware(dict(scope), nothing, ignore)
    finally:
        jsgw.setLevel(level)
    entry = orjson.loads(os.read(read, 1 << 16))
    assert {k: entry[k] for k in ("request_id", "method", "path", "route", "status", "client")} == {
        "request_id": "req-1",
        "method": "DELETE",
        "path": "/x",
        "route": "<unmatched>",
        "status": 204,
        "client": "192.0.2.7:4000",
    }
    assert entry["msg"] == "DELETE /x 204"
    # JSGW_ACCESS_LOG=false: no writer at all.
    await RequestContextMiddleware(answer, Metrics(), None)(dict(scope), nothing, ignore)
    with pytest.raises(BlockingIOError):
        os.read(read, 1 << 16)


async def test_requests_are_made_into_lines_by_the_writer_and_none_is_lost_at_close(
    pipe: tuple[int, int],
) -> None:
    """While the writer runs, the loop keeps each request's fields and the writer makes the
    lines: the same lines, in order, all of them written by close."""
    read, write = pipe
    got = bytearray()
    reader = _drain(read, got)
    access = AccessLog(write)
    jsgw = logging.getLogger("jsgw")
    level = jsgw.level
    jsgw.setLevel(logging.INFO)
    access.start()
    before = time.time_ns() // 1000
    for i in range(5000):
        access.request(f"id-{i}", "GET", f"/v1/kv/b/keys/k{i}", "/r", 200, 0.0012, ("::1", i))
        if i % 500 == 0:
            await asyncio.sleep(0)  # (the loop turns: batches are handed over on its timer)
    access.close()
    jsgw.setLevel(level)
    after = time.time_ns() // 1000
    os.close(write)
    reader.join(10)
    lines = bytes(got).splitlines()
    assert len(lines) == 5000
    for i in (0, 1234, 4999):
        entry = orjson.loads(lines[i])
        stamp = dt.datetime.fromisoformat(entry.pop("ts").replace("Z", "+00:00"))
        assert before <= int(stamp.timestamp() * 1_000_000) <= after
        expected = orjson.loads(
            access.line(0, f"id-{i}", "GET", f"/v1/kv/b/keys/k{i}", "/r", 200, 1.2, f"::1:{i}")
        )
        expected.pop("ts")
        assert entry == expected
    assert access.dropped == 0
