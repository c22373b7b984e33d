"""A small real HTTP application for the push delivery tests, and what they check with it.

:class:`PushApp` is served by uvicorn on a loopback port in the test's own event loop (real
sockets, real HTTP/1.1). Its ``answer`` decides each answer (status, body, headers, delay);
it records every request, when it answered 2xx to which (sequence, delivery count), and how
many requests it holds at once. :class:`AckWatch` subscribes to the consumer's ack subjects
on a plain NATS connection: it sees every ack, nak and term the gateway sends, so a test can
check that no message was acked before the application answered 2xx to that delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats
import orjson
import uvicorn
from nats.aio.msg import Msg

from app.nats.acks import parse_ack_subject


@dataclass
class Received:
    """One request as the application got it."""

    headers: dict[str, str]  # lower-case names
    body: bytes
    path: str
    at: float

    @property
    def seq(self) -> int:
        return int(self.headers["nats-sequence"])

    @property
    def delivered(self) -> int:
        return int(self.headers["nats-delivered"])

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    delay: float = 0.0

    @classmethod
    def json(
        cls,
        document: Any,
        status: int = 200,
        delay: float = 0.0,
        headers: list[tuple[str, str]] | None = None,
    ) -> Answer:
        headers = [("content-type", "application/json"), *(headers or [])]
        return cls(status, orjson.dumps(document), headers, delay)


Behaviour = Callable[[Received], Awaitable[Answer] | Answer]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (it runs inside the test's loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class PushApp:
    """An HTTP application on ``port`` (a free one by default); ``answer`` is its behaviour
    (200 with an empty body unless told otherwise)."""

    def __init__(self, answer: Behaviour | None = None, port: int | None = None) -> None:
        self.answer: Behaviour = answer or (lambda _: Answer())
        self.port = port or free_port()
        self.received: list[Received] = []
        # (seq, delivered) -> when the application answered it 2xx (single-message mode)
        self.ok_at: dict[tuple[int, int], float] = {}
        self.ok: Counter[int] = Counter()  # seq -> 2xx answers
        self.in_flight = 0
        self.max_in_flight = 0
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        config = uvicorn.Config(
            self._asgi,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
            proxy_headers=False,
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve())
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert not self._task.done(), "the push test application did not start"
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop listening: connections are refused until :meth:`start` again (same port)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            self._server.force_exit = True
            await self._task
            self._server = self._task = None

    async def __aenter__(self) -> PushApp:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        request = Received(headers, b"".join(chunks), scope["path"], time.monotonic())
        self.received.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            answer = self.answer(request)
            if not isinstance(answer, Answer):
                answer = await answer
            if answer.delay:
                await asyncio.sleep(answer.delay)
            if 200 <= answer.status < 300 and "nats-sequence" in headers:
                self.ok_at[request.seq, request.delivered] = time.monotonic()
                self.ok[request.seq] += 1
        finally:
            self.in_flight -= 1
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(k.encode(), v.encode()) for k, v in answer.headers],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})


class AckWatch:
    """Every ack the gateway sends on a consumer, seen on a connection of the test's own."""

    def __init__(self) -> None:
        # (seq, delivered) -> [(kind, payload, when)]
        self.seen: dict[tuple[int, int], list[tuple[str, bytes, float]]] = defaultdict(list)
        self._sub: Any = None

    @classmethod
    @contextlib.asynccontextmanager
    async def on(cls, nc: nats.NATS, stream: str, consumer: str) -> AsyncIterator[AckWatch]:
        watch = cls()

        async def seen(msg: Msg) -> None:
            meta = parse_ack_subject(msg.subject)
            if meta is None:
                return
            kind = msg.data.split(b" ", 1)[0].decode(errors="replace")
            watch.seen[meta.stream_seq, meta.delivered].append((kind, msg.data, time.monotonic()))

        watch._sub = await nc.subscribe(f"$JS.ACK.{stream}.{consumer}.>", cb=seen)
        await nc.flush()
        try:
            yield watch
        finally:
            await watch._sub.unsubscribe()

    def acked(self) -> dict[tuple[int, int], float]:
        """(seq, delivered) -> when its +ACK went out."""
        return {
            key: min(when for kind, _, when in events if kind == "+ACK")
            for key, events in self.seen.items()
            if any(kind == "+ACK" for kind, _, _ in events)
        }

    def kinds(self) -> Counter[str]:
        return Counter(kind for events in self.seen.values() for kind, _, _ in events)


def acked_only_after_2xx(app: PushApp, watch: AckWatch) -> list[str]:
    """Each ack of a delivery that the application had not answered 2xx before it."""
    wrong = []
    for key, when in watch.acked().items():
        answered = app.ok_at.get(key)
        if answered is None or answered > when:
            wrong.append(f"seq {key[0]} delivery {key[1]}: acked, 2xx at {answered}")
    return wrong


async def publish(nc: nats.NATS, subject: str, count: int, **headers: str) -> None:
    """``count`` messages ``m<i>`` on ``subject``, each stored (PubAcks awaited in windows)."""
    js = nc.jetstream()
    window = 200
    for start in range(0, count, window):
        acks = [
            js.publish(subject, f"m{i}".encode(), headers=headers or None)
            for i in range(start, min(start + window, count))
        ]
        await asyncio.gather(*acks)


async def consumer_state(gateway: httpx.AsyncClient, stream: str, consumer: str) -> dict[str, Any]:
    response = await gateway.get(f"/v1/streams/{stream}/consumers/{consumer}")
    assert response.status_code == 200, response.text
    info: dict[str, Any] = response.json()
    return info


async def until(check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def drained(
    gateway: httpx.AsyncClient, stream: str, consumer: str, timeout: float
) -> dict[str, Any]:
    """Wait until the consumer has nothing left to deliver and nothing unacked."""
    state: dict[str, Any] = {}

    async def empty() -> bool:
        nonlocal state
        state = await consumer_state(gateway, stream, consumer)
        return state["num_pending"] == 0 and state["num_ack_pending"] == 0

    await until(empty, timeout, f"consumer {stream}/{consumer} drained (last: {state})")
    return state
