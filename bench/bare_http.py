"""The floor of the HTTP stack itself: a bare HTTP/1.1 protocol on uvloop + httptools.

No uvicorn and no ASGI: the parser's callbacks answer, as a server of the gateway's own
would. Beside bench/raw_asgi.py (the same answers through uvicorn's ASGI protocol) it shows
what uvicorn's per-request machinery costs (the ASGI scope, the request/response cycle, the
``send`` messages and their checks, the keep-alive timer), which the raw endpoint, and so the
targets measured against it, include:

* ``GET /v1/kv/{bucket}/keys/{key}``: the raw endpoint's KV-GET-shaped answer from memory,
  written from the parser's callback (no task).
* ``GET /floor/lean/kv/{bucket}/keys/{key}`` and ``POST /floor/lean/publish/{subject}``: a
  task per request making one request by the gateway's NATS client, as bench/raw_asgi.py's
  ``/floor/lean`` routes do (a publish by ``request_write``, as the gateway writes), and its
  reply's data as the answer.
* ``GET /healthz``.

Bench-only: keep-alive HTTP/1.1 with ``Content-Length`` bodies, one request at a time per
connection (wrk's way); paths are put into subjects unchecked.

Run: ``BENCH_NATS_URL=nats://127.0.0.1:PORT python -m bench.bare_http --port N [--workers W]``
(workers share the port with ``SO_REUSEPORT``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

import httptools
import uvloop

VALUE = b"v" * int(os.environ.get("BENCH_VALUE_SIZE", "100"))
_KV_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
    b'etag: "1"\r\nkv-revision: 1\r\nkv-operation: PUT\r\ncontent-length: %d\r\n\r\n%b'
    % (len(VALUE), VALUE)
)
_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_FLOOR = "/floor/lean/"
_lean: object = None  # app.nats.replies.LeanClient, connected at start


def _acknowledged(reply: object) -> bool:
    return b'"seq"' in reply.data  # type: ignore[attr-defined]


class BareProtocol(asyncio.Protocol):
    __slots__ = ("_body", "_parser", "_transport", "_url")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body = b""

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._transport.close()  # type: ignore[attr-defined]

    def on_message_begin(self) -> None:
        self._url = self._body = b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        path = self._url.decode()
        if path.startswith(_FLOOR):
            asyncio.get_running_loop().create_task(self._floor(path[len(_FLOOR) :], self._body))
        elif path.startswith("/v1/kv/"):
            self._transport.write(_KV_ANSWER)  # type: ignore[attr-defined]
        elif path == "/healthz":
            self._transport.write(_OK)  # type: ignore[attr-defined]
        else:
            self._transport.write(_NOT_FOUND)  # type: ignore[attr-defined]

    async def _floor(self, path: str, body: bytes) -> None:
        replies = _lean.replies  # type: ignore[attr-defined]
        if self._parser.get_method() == b"POST":  # publish/{subject}
            subject = path.removeprefix("publish/")
            reply = await replies.request_write(
                subject, body, 5, None, _acknowledged, grace=0.1, resend=False
            )
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        else:  # kv/{bucket}/keys/{key}
            bucket, _, key = path.removeprefix("kv/").partition("/keys/")
            subject = f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}"
            reply = await replies.request(subject, b"", 5)
            revision = reply.headers.first("Nats-Sequence") if reply.raw_headers else None
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                b"kv-revision: %b\r\n" % (revision or "0").encode()
            )
        data = reply.data
        self._transport.write(  # type: ignore[attr-defined]
            b"%bcontent-length: %d\r\n\r\n%b" % (head, len(data), data)
        )


async def _serve(port: int) -> None:
    global _lean
    from app.nats.replies import LeanClient

    _lean = LeanClient()
    await _lean.connect(servers=[os.environ["BENCH_NATS_URL"]])  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    server = await loop.create_server(
        BareProtocol, "127.0.0.1", port, reuse_port=True, backlog=1024
    )
    await stop
    server.close()
    await _lean.close()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    children = []
    for _ in range(args.workers - 1):
        pid = os.fork()
        if pid == 0:
            uvloop.run(_serve(args.port))
            os._exit(0)
        children.append(pid)
    try:
        uvloop.run(_serve(args.port))
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)
            os.waitpid(child, 0)


if __name__ == "__main__":
    main()
