"""The native client the gateway replaces: nats-py (on uvloop), in a process of its own.

One NATS connection, like a typical client. Modes (each prints one JSON line):

* ``kvget`` / ``kvput``: ``kv.get`` (Direct Get, the bucket has allow_direct) / ``kv.put`` over
  ``--keys`` distinct keys with ``--concurrency`` requests in flight;
* ``latency``: ``kv.get`` one at a time, per-request latency;
* ``publish``: ``js.publish`` (waits for the PubAck) with ``--concurrency`` in flight;
* ``batch``: Direct Get batches (``$JS.API.DIRECT.GET.<stream>`` with ``{"seq","batch"}``,
  pages of 1,000 up to the end of the stream, as the gateway pages), read start to end again
  and again;
* ``fetchack``: ``fetch(256)`` on a durable pull consumer, then ``ack_sync`` (a confirmed ack)
  of the 256 messages sent concurrently, again and again.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import nats
import orjson
from nats.js.api import AckPolicy, ConsumerConfig

from bench.stats import (
    closed_loop,
    emit,
    install_uvloop,
    load_options,
    sequential_latency,
    window,
)


def fetch_consumer(name: str) -> ConsumerConfig:
    """The durable pull consumer the fetch + ack loads read (the gateway's and nats-py's)."""
    return ConsumerConfig(
        durable_name=name, ack_policy=AckPolicy.EXPLICIT, ack_wait=60, max_ack_pending=10_000
    )


def key_name(i: int, keys: int) -> str:
    return f"k{i % keys:04d}"


async def main(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(timeout=10)
    try:
        result = await MODES[args.mode](nc, js, args)
    finally:
        await nc.close()
    result["mode"] = args.mode
    emit(result)


async def kvget(nc, js, args):  # type: ignore[no-untyped-def]
    kv = await js.key_value(args.bucket)
    names = [key_name(i, args.keys) for i in range(args.keys)]

    async def op(i: int) -> None:
        await kv.get(names[i % args.keys])

    return await closed_loop(op, args.concurrency, args.duration, args.warmup)


async def kvput(nc, js, args):  # type: ignore[no-untyped-def]
    kv = await js.key_value(args.bucket)
    names = [key_name(i, args.keys) for i in range(args.keys)]
    value = b"v" * args.value_size

    async def op(i: int) -> None:
        await kv.put(names[i % args.keys], value)

    return await closed_loop(op, args.concurrency, args.duration, args.warmup)


async def latency(nc, js, args):  # type: ignore[no-untyped-def]
    kv = await js.key_value(args.bucket)
    names = [key_name(i, args.keys) for i in range(args.keys)]

    async def op(i: int) -> None:
        await kv.get(names[i % args.keys])

    return await sequential_latency(op, args.duration, args.warmup)


async def publish(nc, js, args):  # type: ignore[no-untyped-def]
    payload = b"p" * args.value_size
    subjects = [f"{args.subject}.{i}" for i in range(args.keys)]

    async def op(i: int) -> None:
        await js.publish(subjects[i % args.keys], payload)

    return await closed_loop(op, args.concurrency, args.duration, args.warmup)


async def batch(nc, js, args):  # type: ignore[no-untyped-def]
    api = f"$JS.API.DIRECT.GET.{args.stream}"
    inbox = nc.new_inbox()
    state = {"count": 0, "bytes": 0, "last": 0, "pending": 0}
    page_done: asyncio.Future | None = None

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        headers = msg.headers or {}
        status = headers.get("Status")
        if status:
            if page_done is not None and not page_done.done():
                # 204 EOB carries Nats-Num-Pending; 404 means nothing left.
                state["pending"] = (
                    int(headers.get("Nats-Num-Pending", "0")) if status == "204" else 0
                )
                page_done.set_result(status)
            return
        state["count"] += 1
        state["bytes"] += len(msg.data)
        state["last"] = int(headers["Nats-Sequence"])

    sub = await nc.subscribe(
        inbox, cb=on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=512 * 1024 * 1024
    )

    async def read_stream() -> None:
        nonlocal page_done
        seq = 1
        while True:
            page_done = asyncio.get_running_loop().create_future()
            await nc.publish(api, orjson.dumps({"seq": seq, "batch": 1000}), reply=inbox)
            await asyncio.wait_for(page_done, 10)
            if state["pending"] == 0:
                return
            seq = state["last"] + 1

    deadline = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        await read_stream()
    state.update(count=0, bytes=0)
    window("start")
    t0 = time.perf_counter()
    reads = 0
    while True:
        await read_stream()
        reads += 1
        if time.perf_counter() - t0 >= args.duration:
            break
    elapsed = time.perf_counter() - t0
    window("end")
    await sub.unsubscribe()
    return {
        "messages": state["count"],
        "payload_bytes": state["bytes"],
        "seconds": elapsed,
        "rate": state["count"] / elapsed,
        "mb_s": state["bytes"] / elapsed / 1e6,
        "stream_reads": reads,
    }


async def fetchack(nc, js, args):  # type: ignore[no-untyped-def]
    psub = await js.pull_subscribe_bind(durable=args.consumer, stream=args.stream)
    count = 0
    errors = 0
    exhausted = False

    async def one_round() -> int:
        nonlocal errors
        try:
            msgs = await psub.fetch(args.batch, timeout=2)
        except nats.errors.TimeoutError:
            return 0
        results = await asyncio.gather(
            *(m.ack_sync(timeout=10) for m in msgs), return_exceptions=True
        )
        errors += sum(1 for r in results if isinstance(r, BaseException))
        return len(msgs)

    deadline = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        await one_round()
    errors = 0
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
    return {
        "messages": count,
        "errors": errors,
        "seconds": elapsed,
        "rate": count / elapsed,
        "mb_s": count * args.value_size / elapsed / 1e6,
        "exhausted": exhausted,
    }


MODES = {
    "kvget": kvget,
    "kvput": kvput,
    "latency": latency,
    "publish": publish,
    "batch": batch,
    "fetchack": fetchack,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--nats", required=True)
    p.add_argument("--bucket", default="bench")
    p.add_argument("--stream", default="BATCH")
    p.add_argument("--consumer", default="direct")
    p.add_argument("--subject", default="pub.bench")
    load_options(p)
    return p.parse_args(argv)


if __name__ == "__main__":
    install_uvloop()
    asyncio.run(main(parse()))
