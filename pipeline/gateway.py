"""A small synchronous client of the gateway's HTTP API, for Spark tasks and the driver.

Only what the data source needs: stream info, time-to-sequence lookups, a sequence range read
(as Arrow record batches) by batch Direct Get or, on streams without ``allow_direct``, through
the gateway's consumer-backed range read, consistent multi-subject reads and batch publish.
Errors from the gateway become :class:`GatewayError` carrying its problem document, so a Spark
task fails with the gateway's own explanation.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import httpx
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import wire

log = logging.getLogger("jsgw.pipeline")

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"
# Arrow first; NDJSON when the gateway has no pyarrow (it answers NDJSON instead of a 406).
BATCH_ACCEPT = f"{ARROW_STREAM}, {NDJSON};q=0.5"
DEFAULT_MAX_BATCH = 100_000
# How a range is read: batch Direct Get (streams with allow_direct), or the gateway's
# consumer-backed range read (any stream).
DIRECT = "direct"
CONSUMER = "consumer"
# The problem codes this client acts on (the gateway's ErrorCode values; a test checks them).
MESSAGE_NOT_FOUND = "message.not_found"


class GatewayError(RuntimeError):
    """The gateway answered with a problem (or not at all); ``problem`` is its document."""

    def __init__(
        self, message: str, *, status: int | None = None, problem: dict[str, Any] | None = None
    ) -> None:
        self.status = status
        self.problem = problem or {}
        super().__init__(message)

    @property
    def code(self) -> str | None:
        return self.problem.get("code")

    @classmethod
    def from_problem(
        cls, what: str, problem: dict[str, Any], status: int | None = None
    ) -> GatewayError:
        status = status or problem.get("status")
        text = (
            f"{what}: {status} {problem.get('code', '')}: "
            f"{problem.get('detail') or problem.get('title', '')}"
            f" (request {problem.get('instance', '?')})"
        )
        return cls(text, status=status, problem=problem)


@dataclass(frozen=True, slots=True)
class EndOfBatch:
    num_pending: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the gateway is; picklable, so it travels to the executors inside partitions."""

    url: str
    token: str | None = None
    timeout: float = 60.0

    def client(self) -> Gateway:
        return Gateway(self)


class Gateway:
    def __init__(self, connection: Connection) -> None:
        headers = {"User-Agent": "jsgw-pipeline"}
        if connection.token:
            headers["Authorization"] = f"Bearer {connection.token}"
        self.connection = connection
        self.http = httpx.Client(
            base_url=connection.url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(connection.timeout, connect=10.0),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------

    def _send(self, what: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"{what}: gateway unreachable at {self.connection.url}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise _problem(what, response)
        return response

    # -- streams ---------------------------------------------------------------------------

    def stream_info(self, stream: str) -> dict[str, Any]:
        info: dict[str, Any] = self._send(
            f"stream {stream}", "GET", f"/v1/streams/{_seg(stream)}"
        ).json()
        return info

    def stream_bounds(self, stream: str) -> tuple[int, int]:
        """(first_seq, last_seq) of a stream now; an empty stream has first = last + 1."""
        return bounds(self.stream_info(stream))

    def first_seq_at(self, stream: str, when: str, *, leader: bool = False) -> int | None:
        """The sequence of the first message stored at or after ``when``; None if there is none.
        ``leader``: asked of the stream leader (streams without ``allow_direct``)."""
        params = {"start_time": when}
        if leader:
            params["consistency"] = "leader"
        try:
            response = self._send(
                f"stream {stream} at {when}",
                "GET",
                f"/v1/streams/{_seg(stream)}/direct",
                params=params,
                headers={"Accept": "application/json"},
            )
        except GatewayError as exc:
            if exc.status == 404 and exc.code == MESSAGE_NOT_FOUND:
                return None
            raise
        return int(response.json()["seq"])

    def read_range(
        self,
        stream: str,
        first: int,
        last: int,
        *,
        subject: str | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        wire: str = "arrow",
        via: str = DIRECT,
    ) -> Iterator[pa.RecordBatch]:
        """Every message with ``first <= seq <= last`` (on ``subject``, if given: a literal
        subject by Direct Get, any filter through a consumer).

        Record batches in the gateway's wire schema (:func:`wire.schema`), in sequence order.
        ``via`` :data:`DIRECT`: as few batch Direct Get requests as the gateway allows, each
        abandoned as soon as it passes ``last``; :data:`CONSUMER`: one range read
        (``GET /v1/streams/{s}/messages``), for streams without ``allow_direct``.
        """
        accept = BATCH_ACCEPT if wire == "arrow" else NDJSON
        if via == CONSUMER:
            params: dict[str, Any] = {"start_seq": first, "end_seq": last}
            if subject is not None:
                params["subject"] = subject
            with contextlib.closing(self._batch(stream, "messages", params, accept)) as items:
                for item in items:
                    if isinstance(item, EndOfBatch):
                        return
                    if item.num_rows:
                        yield item
            return
        seq = first
        while seq <= last:
            params = {"seq": seq, "batch": min(last - seq + 1, max_batch)}
            if subject is not None:
                params["next_by_subj"] = subject
            eob: EndOfBatch | None = None
            passed = False
            # Closed as soon as the range is read: the rest of the answer is not wanted.
            with contextlib.closing(self._batch(stream, "direct", params, accept)) as items:
                for item in items:
                    if isinstance(item, EndOfBatch):
                        eob = item
                        break
                    seqs = item.column("seq")
                    if item.num_rows and seqs[-1].as_py() > last:
                        keep = pc.sum(pc.less_equal(seqs, last)).as_py() or 0
                        if keep:
                            yield item.slice(0, keep)
                        passed = True
                        break
                    if item.num_rows:
                        yield item
            if passed or eob is None or eob.num_pending == 0 or eob.last_seq >= last:
                return
            seq = eob.last_seq + 1

    def _batch(
        self, stream: str, route: str, params: dict[str, Any], accept: str
    ) -> Generator[pa.RecordBatch | EndOfBatch, None, None]:
        what = f"stream {stream} read from {params.get('seq') or params.get('start_seq')}"
        try:
            with self.http.stream(
                "GET",
                f"/v1/streams/{_seg(stream)}/{route}",
                params=params,
                headers={"Accept": accept},
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _problem(what, response)
                kind = response.headers.get("content-type", "")
                if kind.startswith(ARROW_STREAM):
                    yield from _arrow_items(what, response)
                else:
                    yield from _ndjson_items(what, response)
        except httpx.HTTPError as exc:
            raise GatewayError(f"{what}: the gateway connection failed: {exc}") from exc

    def multi_last(self, stream: str, subjects: list[str], up_to_seq: int) -> list[dict[str, Any]]:
        """The last message of each subject as of ``up_to_seq`` (Message JSON, data decoded)."""
        response = self._send(
            f"stream {stream} multi read at {up_to_seq}",
            "POST",
            f"/v1/streams/{_seg(stream)}/direct/multi",
            content=orjson.dumps({"subjects": subjects, "up_to_seq": up_to_seq}),
            headers={"Content-Type": "application/json"},
        )
        messages: list[dict[str, Any]] = orjson.loads(response.content)["messages"]
        return messages

    # -- publish ---------------------------------------------------------------------------

    def publish_batch(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``POST /v1/publish``: one result per message, in order (see the API's batch publish)."""
        response = self._send(
            f"publish of {len(messages)} messages",
            "POST",
            "/v1/publish",
            content=orjson.dumps({"messages": messages}),
            headers={"Content-Type": "application/json"},
        )
        results: list[dict[str, Any]] = orjson.loads(response.content)["results"]
        return results


def read_path(info: dict[str, Any]) -> str:
    """How to read a stream's ranges, from its info: Direct Get where it is allowed."""
    return DIRECT if (info.get("config") or {}).get("allow_direct") else CONSUMER


def bounds(info: dict[str, Any]) -> tuple[int, int]:
    """(first_seq, last_seq) from stream info; an empty stream has first = last + 1."""
    state = info.get("state") or {}
    last = int(state.get("last_seq", 0))
    first = int(state.get("first_seq", 0)) or last + 1
    if int(state.get("messages", 0)) == 0:
        first = last + 1
    return first, last


def _seg(name: str) -> str:
    return quote(name, safe="")


def _problem(what: str, response: httpx.Response) -> GatewayError:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and "status" in body:
        return GatewayError.from_problem(what, body, response.status_code)
    text = response.text[:300]
    return GatewayError(f"{what}: HTTP {response.status_code}: {text}", status=response.status_code)


class _ResponseFile(io.RawIOBase):
    """The body of a streamed response as a readable file, for pyarrow's IPC reader."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.iter_bytes()
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _arrow_items(what: str, response: httpx.Response) -> Iterator[pa.RecordBatch | EndOfBatch]:
    reader = pa.ipc.open_stream(io.BufferedReader(_ResponseFile(response), 1 << 20))
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            raise GatewayError(f"{what}: the answer ended without an end-of-batch marker") from None
        marker = metadata.get(b"jsgw") if metadata is not None else None
        if marker == b"eob":
            yield EndOfBatch(int(metadata[b"num_pending"]), int(metadata[b"last_seq"]))
            return
        if marker == b"error":
            raise GatewayError.from_problem(what, orjson.loads(metadata[b"problem"]))
        yield batch


def _ndjson_items(what: str, response: httpx.Response) -> Iterator[pa.RecordBatch | EndOfBatch]:
    rows: list[dict[str, Any]] = []
    for line in response.iter_lines():
        if not line:
            continue
        item = orjson.loads(line)
        if "eob" in item:
            if rows:
                yield wire.from_messages(rows)
            yield EndOfBatch(int(item["num_pending"]), int(item["last_seq"]))
            return
        if "error" in item:
            raise GatewayError.from_problem(what, item["error"])
        item["data"] = base64.b64decode(item["data"])
        rows.append(item)
        if len(rows) >= 1000:
            yield wire.from_messages(rows)
            rows = []
    raise GatewayError(f"{what}: the answer ended without an end-of-batch line")
