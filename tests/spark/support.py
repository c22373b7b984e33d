"""Helpers of the Spark tests: streams and buckets made and read with plain nats-py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pyarrow as pa
import pyarrow.dataset as ds
from nats.js.api import StreamConfig


@dataclass
class Stored:
    subject: str
    seq: int
    data: bytes
    headers: dict[str, str]
    time_ns: int


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def make_stream(url: str, name: str, **config: Any) -> None:
    nc = await nats.connect(url)
    try:
        settings = {"name": name, "subjects": [f"{name}.>"], "allow_direct": True, **config}
        await nc.jetstream().add_stream(StreamConfig(**settings))
    finally:
        await nc.close()


async def publish(url: str, messages: list[tuple[str, bytes, dict[str, str] | None]]) -> list[int]:
    """Publish with PubAcks, many in flight at once; returns the sequences in order."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        seqs: list[int] = []
        for start in range(0, len(messages), 500):
            chunk = messages[start : start + 500]
            acks = await asyncio.gather(*(js.publish(s, d, headers=h) for s, d, h in chunk))
            seqs += [a.seq for a in acks]
        return seqs
    finally:
        await nc.close()


async def read_all(url: str, stream: str, subject: str = ">") -> list[Stored]:
    """Every message of a stream through a nats-py ordered consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        info = await js.stream_info(stream)
        total = info.state.messages
        filter_subject = f"{stream}.>" if subject == ">" else subject
        sub = await js.subscribe(filter_subject, ordered_consumer=True)
        out: list[Stored] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=1 if out or total == 0 else 5)
            except nats.errors.TimeoutError:
                break
            meta = msg.metadata
            out.append(
                Stored(
                    subject=msg.subject,
                    seq=meta.sequence.stream,
                    data=msg.data,
                    headers=dict(msg.headers or {}),
                    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>
                    time_ns=int(msg.reply.split(".")[-2]),
                )
            )
            if meta.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a Parquet output, timestamps as integer microseconds, in sequence order."""
    table = ds.dataset(str(path), format="parquet").to_table()
    for name in ("timestamp", "created"):
        if name in table.column_names:
            index = table.column_names.index(name)
            micros = table.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            table = table.set_column(index, name, micros)
    return sorted(table.to_pylist(), key=lambda r: r.get("sequence") or r.get("revision") or 0)
