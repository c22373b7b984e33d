"""Direct Get batches as an Arrow IPC stream (``Accept: application/vnd.apache.arrow.stream``).

Per-message JSON with base64 costs more than the read itself on both ends; a bulk reader such
as the Spark data source in ``pipeline/`` asks for Arrow instead and receives record batches
it can hand on without touching each message. pyarrow is optional on the gateway: without
it, a client that accepts only Arrow gets 406 and one that also accepts NDJSON gets NDJSON.

The stream carries one schema (:func:`schema`), record batches of up to
:data:`ROWS_PER_BATCH` messages, and ends with a batch of no rows whose custom metadata is
either the end of batch (``jsgw: eob``, ``num_pending``, ``last_seq``) or, when the read
failed after the answer had started, ``jsgw: error`` with the problem document as JSON.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import AsyncIterator
from typing import Any

import orjson

from app import errors
from app.errors import ErrorCode
from app.nats.direct import EndOfBatch, StoredMessage

# pyarrow (with numpy) would be a third of the gateway's memory at start, and only Arrow
# answers use it: the first of them imports it (in a thread: the import takes a few tenths of
# a second that the event loop goes on serving). Until then ``pa`` only says whether it is
# installed; without it ``pa`` is None.
_NOT_IMPORTED: Any = object()
pa: Any = None if importlib.util.find_spec("pyarrow") is None else _NOT_IMPORTED

ARROW_STREAM = "application/vnd.apache.arrow.stream"
FORMAT_VERSION = "direct-batch/1"
ROWS_PER_BATCH = 1000
BYTES_PER_BATCH = 4 * 1024 * 1024


# OpenAPI ``responses`` entry of the 406, for the routes that answer Arrow.
RESPONSES: dict[int | str, dict[str, Any]] = {
    406: {
        "description": "Arrow asked for alone, and the gateway has no pyarrow",
        "content": {
            errors.PROBLEM_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
}


def available() -> bool:
    return pa is not None


async def _import_pyarrow() -> None:
    global pa
    if pa is _NOT_IMPORTED:
        pa = await asyncio.to_thread(importlib.import_module, "pyarrow")


def wants_arrow(accept: str) -> bool:
    return ARROW_STREAM in accept


def accepts_ndjson(accept: str) -> bool:
    return "application/x-ndjson" in accept or "*/*" in accept


def check_available(accept: str) -> bool:
    """True to answer in Arrow, False to fall back on NDJSON; 406 when neither will do."""
    if not wants_arrow(accept):
        return False
    if available():
        return True
    if accepts_ndjson(accept):
        return False
    raise errors.NotAcceptable(
        ErrorCode.DIRECT_ARROW_UNAVAILABLE,
        "this gateway cannot answer in Arrow (pyarrow is not installed); "
        "accept application/x-ndjson as well to get NDJSON",
    )


def schema() -> Any:
    return pa.schema(
        [
            pa.field("stream", pa.string(), nullable=False),
            pa.field("subject", pa.string(), nullable=False),
            pa.field("seq", pa.uint64(), nullable=False),
            pa.field("time", pa.timestamp("ns", tz="UTC")),
            pa.field("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
            pa.field("data", pa.binary(), nullable=False),
        ],
        metadata={"jsgw.format": FORMAT_VERSION},
    )


class _Sink:
    """A file-like object that pyarrow writes into and that is drained after each batch."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def drain(self) -> bytes:
        out = b"".join(self.chunks)
        self.chunks.clear()
        return out


class _Rows:
    """Column buffers for one record batch."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.seqs: list[int] = []
        self.times: list[str | None] = []
        self.headers: list[list[tuple[str, list[str]]] | None] = []
        self.data: list[bytes] = []
        self.size = 0
        self.stream = ""

    def take(self, messages: list[StoredMessage], start: int) -> int:
        """Messages from ``start`` on, until the batch is full; where it stopped."""
        count, size, end, stop = len(self.seqs), self.size, start, len(messages)
        while end < stop and count < ROWS_PER_BATCH and size < BYTES_PER_BATCH:
            message = messages[end]
            size += len(message.data) + len(message.subject)
            count += 1
            end += 1
        if end == start:
            return end
        chunk = messages[start:end]
        self.stream = chunk[-1].stream
        self.subjects += [m.subject for m in chunk]
        self.seqs += [m.seq for m in chunk]
        self.times += [m.time for m in chunk]
        self.headers += [list(m.headers.items()) if m.headers else None for m in chunk]
        self.data += [m.data for m in chunk]
        self.size = size
        return end

    @property
    def full(self) -> bool:
        return len(self.seqs) >= ROWS_PER_BATCH or self.size >= BYTES_PER_BATCH

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(self, arrow_schema: Any) -> Any:
        n = len(self.seqs)
        times = pa.array(self.times, pa.string()).cast(pa.timestamp("ns", tz="UTC"))
        columns = [
            pa.repeat(pa.scalar(self.stream, pa.string()), n),
            pa.array(self.subjects, pa.string()),
            pa.array(self.seqs, pa.uint64()),
            times,
            pa.array(self.headers, arrow_schema.field("headers").type),
            pa.array(self.data, pa.binary()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema)


def _marker(arrow_schema: Any, writer: Any, metadata: dict[str, str]) -> None:
    empty = pa.RecordBatch.from_pylist([], schema=arrow_schema)
    writer.write_batch(empty, custom_metadata=metadata)


async def encode(
    first: list[StoredMessage] | EndOfBatch,
    rest: AsyncIterator[list[StoredMessage] | EndOfBatch],
) -> AsyncIterator[bytes]:
    """The Arrow IPC stream of a batch read: record batches, then the EOB (or error) marker.

    Messages come a page at a time; a record batch ends at ROWS_PER_BATCH rows or
    BYTES_PER_BATCH bytes, wherever the pages end, and what a page completes is one chunk.
    """
    await _import_pyarrow()
    arrow_schema = schema()
    sink = _Sink()
    writer = pa.ipc.new_stream(sink, arrow_schema)
    rows = _Rows()
    item: list[StoredMessage] | EndOfBatch = first
    try:
        while True:
            if isinstance(item, EndOfBatch):
                if rows:
                    writer.write_batch(rows.batch(arrow_schema))
                _marker(
                    arrow_schema,
                    writer,
                    {
                        "jsgw": "eob",
                        "num_pending": str(item.num_pending),
                        "last_seq": str(item.last_seq),
                    },
                )
                writer.close()
                yield sink.drain()
                return
            taken = 0
            while taken < len(item):
                taken = rows.take(item, taken)
                if rows.full:
                    writer.write_batch(rows.batch(arrow_schema))
                    rows = _Rows()
            if sink.chunks:
                yield sink.drain()
            item = await anext(rest)
    except errors.GatewayError as exc:
        # The status line is gone already: the problem travels in the last batch's metadata.
        if rows:
            writer.write_batch(rows.batch(arrow_schema))
        _marker(
            arrow_schema, writer, {"jsgw": "error", "problem": orjson.dumps(exc.problem()).decode()}
        )
        writer.close()
        yield sink.drain()
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
