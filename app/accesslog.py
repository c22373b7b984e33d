"""The access log: one JSON line per request, written without the ``logging`` machinery.

A line through ``logging`` (a record, its attributes, a formatter walking them, a handler's
lock and a write to stderr per request) cost about 23 µs; here the event loop only keeps each
request's fields (one tuple), and the writer thread below makes the lines from them, a batch at
a time, by filling one pre-encoded template (on the loop, a line made there cost several
times what the same code costs in the writer's tight loop). The fields and their formats
are the ones :class:`app.logs.JsonFormatter` writes for a ``jsgw.access`` record (``ts`` always
with its microseconds), and lines are written only when that logger is enabled for info, as
before (``JSGW_LOG_LEVEL``).

Writing never blocks the event loop: a batch of lines is handed, 50 ms after its
first line (or at once past :data:`FLUSH_BYTES`), to a thread of its own that writes it to
the descriptor (stderr, where every other log line goes). Each write holds whole lines and, on
a pipe, at most ``PIPE_BUF`` (4096) bytes, which the kernel writes in one piece: the lines of
several workers sharing one stderr never interleave (a single line longer than that is written
alone, in one write). A reader slower than the gateway stalls only that thread; once
:data:`MAX_PENDING` bytes wait, further lines are dropped and counted
(``jsgw_access_log_dropped_total``) rather than held without bound.

The buffering lasts from :meth:`AccessLog.start` to :meth:`AccessLog.close` (the lifespan):
close hands over what is left and waits for it to be written, so a gateway stopped by SIGTERM
loses no line. Outside that span (a line after shutdown) a line is written at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Callable

import orjson

logger = logging.getLogger("jsgw.access")

# Seconds from a batch's first line to its hand-over: each hand-over wakes the writer thread,
# which then takes the GIL from the busy loop, so batches are few and large.
FLUSH_DELAY = 0.05
FLUSH_BYTES = 256 * 1024  # a batch this large is handed over at once
MAX_PENDING = 4 * 1024 * 1024  # buffered and not yet written: past it, lines are dropped
PIPE_BUF = 4096  # what a pipe writes atomically (POSIX's minimum, Linux's value)
CLOSE_TIMEOUT = 10.0  # how long close waits for the writer (a reader that never reads)

_INFO = logging.INFO

# The line JsonFormatter writes for a ``jsgw.access`` record, its fields left to fill in.
_LINE = (
    b'{"ts":"%b%06dZ","level":"info","logger":"jsgw.access","msg":"%b %b %d","request_id":%b,'
    b'"method":%b,"path":%b,"route":%b,"status":%d,"duration_ms":%b,"client":%b}\n'
)


# A request's fields, kept on the loop until the writer makes its line: µs since the epoch,
# request id, method, path, route, status, seconds taken, client address.
Record = tuple[int, str, str, str, str, int, float, "tuple[str, int] | None"]
# What a line holds besides its path (for the bound on what waits to be written).
_RECORD_BYTES = 300


@functools.lru_cache(maxsize=1024)
def _encoded(text: str) -> bytes:
    """A text from a small set (route templates, methods) as a JSON string."""
    return orjson.dumps(text)


class AccessLog:
    """The access lines of one process, buffered and written by a thread (see the module)."""

    def __init__(
        self,
        fd: int = 2,
        *,
        on_drop: Callable[[], None] | None = None,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.fd = fd
        self.max_pending = max_pending
        self.on_drop = on_drop
        self.dropped = 0
        # The batch being gathered on the loop: lines, and requests' fields to make lines of.
        self._items: list[bytes | Record] = []
        self._size = 0  # its bytes (a request's: about its line's)
        self._handed = 0  # bytes handed to the writer (counted by the loop only)
        self._written = 0  # bytes the writer is done with (counted by the writer only)
        self._queue: queue.SimpleQueue[tuple[list[bytes | Record], int] | None] = (
            queue.SimpleQueue()
        )
        self._writer: threading.Thread | None = None
        self._second = -1  # the second _prefix is the text of
        self._prefix = b""

    def enabled(self) -> bool:
        return logger.isEnabledFor(_INFO)

    def request(
        self,
        request_id: str,
        method: str,
        path: str,
        route: str,
        status: int,
        elapsed: float,
        client: tuple[str, int] | None,
    ) -> None:
        """The line of one request answered now, ``elapsed`` seconds after it came (what the
        middleware calls); nothing below info (``JSGW_LOG_LEVEL``).

        While the writer runs, the loop only keeps the request's fields (one tuple): the
        writer thread makes the lines, a batch at a time."""
        if logger.isEnabledFor(_INFO):
            record = (
                time.time_ns() // 1000,
                request_id,
                method,
                path,
                route,
                status,
                elapsed,
                client,
            )
            if self._writer is None:
                self.write(self._format(record))
            else:
                self._add(record, _RECORD_BYTES + len(path))

    def _format(self, record: Record) -> bytes:
        now_us, request_id, method, path, route, status, elapsed, client = record
        return self.line(
            now_us,
            request_id,
            method,
            path,
            route,
            status,
            round(elapsed * 1000, 3),
            f"{client[0]}:{client[1]}" if client else None,
        )

    def line(
        self,
        now_us: int,
        request_id: str,
        method: str,
        path: str,
        route: str,
        status: int,
        duration_ms: float,
        client: str | None,
    ) -> bytes:
        """The JSON line (with its newline) of one request answered at ``now_us`` (µs since
        the epoch): the keys, order and formats of JsonFormatter's ``jsgw.access`` lines.

        One pre-encoded template filled with the request's fields: the texts a client chose
        (the path, the request id) are JSON-encoded by orjson, the others come from small
        caches (a route template, a method, the text of the current second)."""
        second, micro = divmod(now_us, 1_000_000)
        if second != self._second:  # (the text of the second, once a second)
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second)).encode()
            self._second = second
        dumps = orjson.dumps
        encoded_path, encoded_method = dumps(path), _encoded(method)
        return _LINE % (
            self._prefix,
            micro,
            encoded_method[1:-1],
            encoded_path[1:-1],
            status,
            dumps(request_id),
            encoded_method,
            encoded_path,
            _encoded(route),
            status,
            dumps(duration_ms),
            b"null" if client is None else dumps(client),
        )

    def write(self, line: bytes) -> None:
        """Buffer one line; written within :data:`FLUSH_DELAY` (never on the loop)."""
        if self._writer is None:
            _write_all(self.fd, [line], self._pipe_chunk())
        else:
            self._add(line, len(line))

    def _add(self, item: bytes | Record, size: int) -> None:
        """Buffer a line, or a request's fields to make one of (``size``: about its bytes)."""
        if self._size + self._handed - self._written + size > self.max_pending:
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop()
            return
        items = self._items
        items.append(item)
        self._size += size
        if len(items) == 1:
            try:
                asyncio.get_running_loop().call_later(FLUSH_DELAY, self._hand_over)
            except RuntimeError:  # (no event loop in this thread: no later)
                self._hand_over()
        elif self._size >= FLUSH_BYTES:
            self._hand_over()

    def start(self) -> None:
        """Buffer from now on: lines are written by a thread of their own."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._run, args=(self._pipe_chunk(),), name="jsgw-access-log", daemon=True
            )
            self._writer.start()

    def close(self) -> None:
        """Write what is buffered and stop the thread (blocks until written, within
        :data:`CLOSE_TIMEOUT`); later lines are written at once."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._hand_over()
        self._queue.put(None)
        writer.join(CLOSE_TIMEOUT)

    def _hand_over(self) -> None:
        if self._items:
            items, self._items = self._items, []
            self._handed += self._size
            self._queue.put((items, self._size))
            self._size = 0

    def _pipe_chunk(self) -> int:
        """The most one write may hold: PIPE_BUF on a pipe, else FLUSH_BYTES."""
        try:
            is_pipe = stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        except OSError:
            is_pipe = False
        return PIPE_BUF if is_pipe else FLUSH_BYTES

    def _run(self, chunk: int) -> None:
        while (batch := self._queue.get()) is not None:
            items, size = batch
            lines = [item if isinstance(item, bytes) else self._format(item) for item in items]
            del items, batch
            _write_all(self.fd, lines, chunk)
            self._written += size


def _write_all(fd: int, lines: list[bytes], chunk: int) -> None:
    """Whole lines, at most ``chunk`` bytes per write (one longer line alone)."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > chunk:
            _write(fd, b"".join(batch))
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        _write(fd, b"".join(batch))


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except BlockingIOError:  # a descriptor someone made non-blocking: wait for room
            time.sleep(0.001)
            continue
        except OSError:  # stderr closed, EPIPE: nothing can be written there any more
            return
        view = view[written:]
