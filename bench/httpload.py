"""HTTP load that wrk cannot do, by an asyncio client (uvloop + bench.http1) in its own process.

Modes (each prints one JSON line):

* ``latency``: GET ``--path`` (``{key}`` replaced by one of ``--keys`` keys) one at a time on
  one keep-alive connection; per-request latency;
* ``batch``: ``GET /v1/streams/<stream>/direct?seq=1&batch=<n>`` read start to end again and
  again, as NDJSON (``--format ndjson``: messages counted from the lines) or as an Arrow IPC
  stream (``--format arrow``: the body decoded by pyarrow, messages counted from its rows);
  MB/s of message payload and of the wire;
* ``fetchack``: ``POST .../fetch {"max_messages": 256}`` then ``POST .../ack`` with all the
  tokens (the gateway answers after the server confirmed every ack), again and again;
* ``pubbatch``: ``POST /v1/publish`` with ``--batch`` messages (non-atomic: one PubAck
  each) from ``--concurrency`` connections back to back; messages/s;
* ``throughput``: ``--concurrency`` connections each sending ``--method --path`` back to back
  (the fallback when wrk is not installed: then the client, not the server, may be the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
from urllib.parse import urlsplit

import orjson

from bench.http1 import Connection
from bench.stats import (
    closed_loop,
    emit,
    install_uvloop,
    load_options,
    sequential_latency,
    window,
)


def key_name(i: int, keys: int) -> str:
    return f"k{i % keys:04d}"


async def latency(host: str, port: int, args: argparse.Namespace) -> dict:
    conn = await Connection.open(host, port)
    reqs = [
        conn.build("GET", args.path.replace("{key}", key_name(i, args.keys)))
        for i in range(args.keys)
    ]
    bad = 0

    async def op(i: int) -> None:
        nonlocal bad
        status, _ = await conn.send(reqs[i % args.keys])
        if status != 200:
            bad += 1

    result = await sequential_latency(op, args.duration, args.warmup)
    conn.close()
    result["non_200"] = bad
    return result


async def throughput(host: str, port: int, args: argparse.Namespace) -> dict:
    conns = [await Connection.open(host, port) for _ in range(args.concurrency)]
    body = b"v" * args.value_size if args.method in ("PUT", "POST") else None
    reqs = [
        conns[0].build(args.method, args.path.replace("{key}", key_name(i, args.keys)), body)
        for i in range(args.keys)
    ]

    async def op(i: int) -> None:
        status, _ = await conns[i % args.concurrency].send(reqs[i % args.keys])
        if status >= 300:
            raise RuntimeError(f"HTTP {status}")

    result = await closed_loop(op, args.concurrency, args.duration, args.warmup)
    for c in conns:
        c.close()
    return result


async def batch(host: str, port: int, args: argparse.Namespace) -> dict:
    conn = await Connection.open(host, port)
    arrow = args.format == "arrow"
    headers = {"Accept": "application/vnd.apache.arrow.stream"} if arrow else None
    req = conn.build(
        "GET", f"/v1/streams/{args.stream}/direct?seq=1&batch={args.batch}", headers=headers
    )
    state = {"lines": 0, "wire": 0, "tail": b""}
    body: list[bytes] = []

    def sink(chunk: bytes) -> None:
        state["lines"] += chunk.count(b"\n")
        state["wire"] += len(chunk)
        state["tail"] = (state["tail"] + chunk)[-200:]

    def arrow_sink(chunk: bytes) -> None:
        state["wire"] += len(chunk)
        body.append(chunk)

    async def read_once() -> int:
        state["tail"] = b""
        before = state["lines"]
        status, _ = await conn.send(req, sink)
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        last = state["tail"].rstrip(b"\n").rsplit(b"\n", 1)[-1]
        if b'"eob"' not in last:
            raise RuntimeError(f"no end-of-batch line: {last[:120]!r}")
        return state["lines"] - before - 1

    async def read_arrow() -> int:
        body.clear()
        status, _ = await conn.send(req, arrow_sink)
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        return arrow_rows(b"".join(body))

    read = read_arrow if arrow else read_once
    deadline = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        await read()
    state.update(lines=0, wire=0)
    messages = reads = 0
    window("start")
    t0 = time.perf_counter()
    while True:
        messages += await read()
        reads += 1
        if time.perf_counter() - t0 >= args.duration:
            break
    elapsed = time.perf_counter() - t0
    window("end")
    conn.close()
    return {
        "format": args.format,
        "messages": messages,
        "seconds": elapsed,
        "rate": messages / elapsed,
        "mb_s": messages * args.value_size / elapsed / 1e6,
        "wire_mb_s": state["wire"] / elapsed / 1e6,
        "stream_reads": reads,
    }


def arrow_rows(body: bytes) -> int:
    """The rows of an Arrow IPC stream, every batch decoded (its columns touched); the stream
    must end in the end-of-batch marker."""
    import pyarrow as pa

    rows = 0
    marker: dict[bytes, bytes] = {}
    with pa.ipc.open_stream(body) as reader:
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            rows += batch.num_rows
            if batch.num_rows and batch.column("seq")[-1].as_py() < rows:
                raise RuntimeError("sequences out of order")
            marker = dict(meta) if meta is not None else {}
    if marker.get(b"jsgw") != b"eob":
        raise RuntimeError(f"no end-of-batch marker: {marker!r}")
    return rows


async def fetchack(host: str, port: int, args: argparse.Namespace) -> dict:
    conn = await Connection.open(host, port)
    base = f"/v1/streams/{args.stream}/consumers/{args.consumer}"
    fetch_req = conn.build(
        "POST",
        f"{base}/fetch",
        orjson.dumps({"max_messages": args.batch, "expires": 2}),
        {"Content-Type": "application/json"},
    )
    state = {"errors": 0, "first_error": None}

    async def one_round() -> int:
        status, body = await conn.send(fetch_req)
        if status != 200:
            raise RuntimeError(f"fetch: HTTP {status}: {body[:200]!r}")
        messages = orjson.loads(body)["messages"]
        if not messages:
            return 0
        acks = orjson.dumps({"acks": [{"token": m["ack_token"], "kind": "ack"} for m in messages]})
        status, body = await conn.request(
            "POST", f"{base}/ack", acks, {"Content-Type": "application/json"}
        )
        if status != 200:
            raise RuntimeError(f"ack: HTTP {status}: {body[:200]!r}")
        failed = [r for r in orjson.loads(body)["results"] if not r.get("ok")]
        if failed:
            state["errors"] += len(failed)
            state["first_error"] = state["first_error"] or failed[0]
        return len(messages)

    deadline = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        await one_round()
    state["errors"] = 0
    count = 0
    exhausted = False
    window("start")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.duration:
        got = await one_round()
        count += got
        if got < args.batch:
            exhausted = True
            break
    elapsed = time.perf_counter() - t0
    window("end")
    conn.close()
    return {
        "messages": count,
        "errors": state["errors"],
        "first_error": state["first_error"],
        "seconds": elapsed,
        "rate": count / elapsed,
        "mb_s": count * args.value_size / elapsed / 1e6,
        "exhausted": exhausted,
    }


async def pubbatch(host: str, port: int, args: argparse.Namespace) -> dict:
    conns = [await Connection.open(host, port) for _ in range(args.concurrency)]
    data = base64.b64encode(b"v" * args.value_size).decode()
    bodies = [
        orjson.dumps(
            {
                "messages": [
                    {"subject": f"pub.hb.{(i + j) % 1000}", "data": data} for j in range(args.batch)
                ]
            }
        )
        for i in range(0, 1000, 37)
    ]
    reqs = [
        conns[0].build("POST", "/v1/publish", body, {"Content-Type": "application/json"})
        for body in bodies
    ]

    async def op(i: int) -> None:
        status, body = await conns[i % args.concurrency].send(reqs[i % len(reqs)])
        if status != 200 or b'"ok":false' in body:
            raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

    result = await closed_loop(op, args.concurrency, args.duration, args.warmup)
    for c in conns:
        c.close()
    result["requests"] = result.get("ops")
    result["ops"] = result["messages"] = (result.get("ops") or 0) * args.batch
    result["rate"] *= args.batch
    return result


MODES = {
    "latency": latency,
    "batch": batch,
    "fetchack": fetchack,
    "pubbatch": pubbatch,
    "throughput": throughput,
}


async def main(args: argparse.Namespace) -> None:
    url = urlsplit(args.url)
    result = await MODES[args.mode](url.hostname or "127.0.0.1", url.port or 80, args)
    result["mode"] = args.mode
    emit(result)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--path", default="/v1/kv/bench/keys/{key}")
    p.add_argument("--method", default="GET")
    p.add_argument("--stream", default="BATCH")
    p.add_argument("--consumer", default="http")
    p.add_argument("--format", choices=("ndjson", "arrow"), default="ndjson", help="batch mode")
    load_options(p)
    return p.parse_args(argv)


if __name__ == "__main__":
    install_uvloop()
    asyncio.run(main(parse()))
