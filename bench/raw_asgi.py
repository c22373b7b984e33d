"""The ceiling of this HTTP stack: raw ASGI on uvicorn (uvloop + httptools), no framework.

* ``GET /v1/kv/{bucket}/keys/{key}``: a KV-GET-shaped answer (raw value, ``ETag``,
  ``KV-Revision``, ``KV-Operation``) from memory, no NATS: what answering a KV GET costs the
  server when nothing but HTTP is done.
* ``PUT /v1/kv/{bucket}/keys/{key}``: reads the body, answers ``{"revision": 1}``.
* ``GET /sse``: a minimal SSE broadcaster, the limit of this stack for fan-out: one ordered
  JetStream consumer per worker on ``$KV.<BENCH_SSE_BUCKET>.>`` (new messages only); each
  update is encoded once (the same Entry JSON the gateway sends) and the same bytes are put on
  one unbounded queue per connection. ``event: ready`` is sent on connect. The consumer exists
  only while the worker has SSE clients (nats-server 2.15 allows 1,000 consumers per stream
  by default, and the gateway's watches on the same bucket must not lose one to it).

* ``GET /floor/kv/{bucket}/keys/{key}`` and ``POST /floor/publish/{subject}``: the floor of a
  NATS-backed request on this stack: one nats-py request per HTTP request (a Direct Get of the
  key's last value; a publish waiting for its PubAck), the reply's data answered as it came:
  no validation, authorization, error model, metrics or access log. Paths are bench-only and
  put into subjects unchecked.
* ``GET /floor/lean/kv/{bucket}/keys/{key}`` and ``POST /floor/lean/publish/{subject}``: the
  same, each request made by the gateway's own NATS client (``app.nats.replies.LeanClient``:
  its reply mux, the raw reply; a publish by ``request_write``, as the gateway's) instead of
  nats-py's ``request``: the floor of the NATS leg the gateway actually uses.

Run: ``BENCH_NATS_URL=nats://127.0.0.1:PORT BENCH_SSE_BUCKET=watch
uvicorn bench.raw_asgi:app --loop uvloop --http httptools --no-access-log``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import os

import orjson

VALUE = b"v" * int(os.environ.get("BENCH_VALUE_SIZE", "100"))
_GET_HEADERS = [
    (b"content-type", b"application/octet-stream"),
    (b"etag", b'"1"'),
    (b"kv-revision", b"1"),
    (b"kv-operation", b"PUT"),
]
_GET_START = {"type": "http.response.start", "status": 200, "headers": _GET_HEADERS}
_GET_BODY = {"type": "http.response.body", "body": VALUE}
_PUT_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"etag", b'"1"')],
}
_PUT_BODY = {"type": "http.response.body", "body": b'{"revision":1}'}
_NOT_FOUND = {"type": "http.response.start", "status": 404, "headers": []}
_SSE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")],
}
_READY = b"event: ready\r\ndata: {}\r\n\r\n"

QUEUES: set[asyncio.Queue[bytes]] = set()
_nats: dict[str, object] = {}


def _encode(msg) -> bytes:  # type: ignore[no-untyped-def]
    """The gateway's Entry JSON, built once per update for all connections."""
    meta = msg.metadata
    bucket_and_key = msg.subject.split(".", 2)
    entry = {
        "bucket": bucket_and_key[1],
        "key": bucket_and_key[2],
        "value": base64.b64encode(msg.data).decode(),
        "revision": meta.sequence.stream,
        "created": meta.timestamp.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "delta": meta.num_pending,
        "operation": "PUT",
    }
    return b"id: %d\r\nevent: put\r\ndata: %s\r\n\r\n" % (meta.sequence.stream, orjson.dumps(entry))


async def _on_update(msg) -> None:  # type: ignore[no-untyped-def]
    event = _encode(msg)
    for queue in QUEUES:
        queue.put_nowait(event)


async def _startup() -> None:
    url = os.environ.get("BENCH_NATS_URL")
    if not url:
        return
    import nats

    from app.nats.replies import LeanClient
    from app.publish.service import acknowledged

    _nats["acknowledged"] = acknowledged

    _nats["nc"] = await nats.connect(url)
    lean = LeanClient()
    await lean.connect(servers=[url])
    _nats["lean"] = lean
    _nats["lock"] = asyncio.Lock()


async def _floor(method: str, path: str, receive, send) -> None:  # type: ignore[no-untyped-def]
    """One NATS request (nats-py's, or under /floor/lean the gateway's client's), its reply's
    data as the answer (see the module)."""
    lean = path.startswith("/floor/lean/")
    path = path.removeprefix("/floor/lean/" if lean else "/floor/")
    if method == "POST":  # publish/{subject}
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        subject, payload = path.removeprefix("publish/"), body
        headers = [(b"content-type", b"application/json")]
    else:  # kv/{bucket}/keys/{key}
        bucket, _, key = path.removeprefix("kv/").partition("/keys/")
        subject, payload = f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}", b""
        headers = [(b"content-type", b"application/octet-stream")]
    if lean and method == "POST":  # a write, as the gateway sends one (its refusals confirmed)
        replies = _nats["lean"].replies  # type: ignore[attr-defined]
        reply = await replies.request_write(
            subject, payload, 5, None, _nats["acknowledged"], grace=0.1, resend=False
        )
        revision = None
    elif lean:
        reply = await _nats["lean"].replies.request(subject, payload, 5)  # type: ignore[attr-defined]
        revision = reply.headers.first("Nats-Sequence") if reply.raw_headers else None
    else:
        reply = await _nats["nc"].request(subject, payload, timeout=5)  # type: ignore[attr-defined]
        revision = (reply.headers or {}).get("Nats-Sequence")
    if method != "POST":
        headers.append((b"kv-revision", (revision or "0").encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply.data})


def _watches() -> bool:
    """SSE clients get the bucket's updates (with NATS and ``BENCH_SSE_BUCKET``)."""
    return "nc" in _nats and bool(os.environ.get("BENCH_SSE_BUCKET"))


async def _subscribe() -> None:
    """Start the worker's consumer when its first SSE client arrives."""
    from nats.js.api import DeliverPolicy

    async with _nats["lock"]:  # type: ignore[attr-defined]
        if "sub" in _nats:
            return
        js = _nats["nc"].jetstream()  # type: ignore[attr-defined]
        bucket = os.environ["BENCH_SSE_BUCKET"]
        _nats["sub"] = await js.subscribe(
            f"$KV.{bucket}.>",
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            cb=_on_update,
        )


async def _unsubscribe() -> None:
    """Delete the consumer when the worker's last SSE client has gone."""
    async with _nats["lock"]:  # type: ignore[attr-defined]
        if QUEUES or "sub" not in _nats:
            return
        sub = _nats.pop("sub")
        with contextlib.suppress(Exception):
            name = (await sub.consumer_info()).name  # type: ignore[attr-defined]
            await sub.unsubscribe()  # type: ignore[attr-defined]
            js = _nats["nc"].jetstream()  # type: ignore[attr-defined]
            await js.delete_consumer(f"KV_{os.environ['BENCH_SSE_BUCKET']}", name)


async def _shutdown() -> None:
    nc = _nats.pop("nc", None)
    if nc is not None:
        with contextlib.suppress(Exception):
            await nc.close()  # type: ignore[attr-defined]


async def _sse(receive, send) -> None:  # type: ignore[no-untyped-def]
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    gone = asyncio.Event()

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        queue.put_nowait(b"")

    watcher = asyncio.ensure_future(watch_disconnect())
    QUEUES.add(queue)
    try:
        if _watches():
            await _subscribe()
        await send(_SSE_START)
        await send({"type": "http.response.body", "body": _READY, "more_body": True})
        while not gone.is_set():
            event = await queue.get()
            if not event:
                break
            await send({"type": "http.response.body", "body": event, "more_body": True})
    except OSError:
        pass
    finally:
        QUEUES.discard(queue)
        watcher.cancel()
        if not QUEUES and _watches():
            await _unsubscribe()


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    kind = scope["type"]
    if kind == "http":
        method = scope["method"]
        path = scope["path"]
        if method == "GET" and path.startswith("/v1/kv/"):
            await send(_GET_START)
            await send(_GET_BODY)
        elif method == "PUT" and path.startswith("/v1/kv/"):
            more = True
            while more:
                message = await receive()
                more = message.get("more_body", False)
            await send(_PUT_START)
            await send(_PUT_BODY)
        elif path.startswith("/floor/") and "nc" in _nats:
            await _floor(method, path, receive, send)
        elif method == "GET" and path == "/sse":
            await _sse(receive, send)
        elif path == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        else:
            await send(_NOT_FOUND)
            await send({"type": "http.response.body", "body": b""})
    elif kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await _startup()
                except Exception as exc:  # noqa: BLE001
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await _shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
