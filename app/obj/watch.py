"""A watch of a bucket's object infos (ADR-20 Watch), on the KV watches' ordered consumer.

The meta subjects ``$O.<bucket>.M.>`` are read by :class:`app.nats.ordered.OrderedConsumer`
(the protocol the KV watches run: re-created after a gap or a restart from the sequence after
the last one handed on, so nothing is lost or repeated): the last info of every object first
(``last_per_subject``), then ``ready`` once nothing is pending, then every change. An event's
id is its meta message's stream sequence; resuming after it (``by_start_sequence``) sends
every change since, then ``ready``. Events are dicts that an SSE response writes as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from app import errors
from app.errors import ErrorCode
from app.nats.jsapi import JetStreamApi
from app.nats.ordered import OrderedConfig, OrderedConsumer
from app.nats.scan import Delivery
from app.obj import model

MAX_QUEUED = 10_000  # events waiting for a client that reads slowly; past this it is cut off

Event = dict[str, Any]


class _Listener:
    def __init__(self, bucket: str, visible: Callable[[str], bool]) -> None:
        self.bucket = bucket
        self.visible = visible
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.ready = False

    def _put(self, event: Event | None) -> None:
        if self.queue.qsize() >= MAX_QUEUED:
            error = errors.TooManyRequests(
                ErrorCode.KV_WATCH_TOO_SLOW, "the client reads the watch too slowly"
            )
            self.queue.put_nowait(_error_event(error))
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(event)

    def _ready(self, position: int) -> None:
        if not self.ready:
            self.ready = True
            self._put(
                {
                    "event": "ready",
                    "id": str(position),
                    "data": orjson.dumps({"seq": position}).decode(),
                }
            )

    def on_start(self, num_pending: int, position: int) -> None:
        if num_pending == 0:
            self._ready(position)

    def on_message(self, message: Delivery) -> None:
        try:
            info = model.parse_info(message.data, message.stream_seq)
        except errors.GatewayError:
            info = None
        if info is not None and self.visible(info.name):
            data = orjson.dumps(info.to_json()).decode()
            self._put({"event": "info", "id": str(message.stream_seq), "data": data})
        if message.pending == 0:
            self._ready(message.stream_seq)

    def on_error(self, error: errors.GatewayError) -> None:
        if isinstance(error, errors.StreamDeleted):
            error = errors.NotFound(
                ErrorCode.OBJ_BUCKET_NOT_FOUND, f"bucket {self.bucket!r} was deleted"
            )
        self._put(_error_event(error))
        self._put(None)


def _error_event(error: errors.GatewayError) -> Event:
    return {"event": "error", "data": orjson.dumps(error.problem(None)).decode()}


async def watch_events(
    js: JetStreamApi,
    bucket: str,
    *,
    since: int | None,
    updates_only: bool,
    visible: Callable[[str], bool],
    idle_heartbeat: float = 5.0,
) -> AsyncIterator[Event]:
    if since is not None:
        policy, start = "by_start_sequence", since + 1
    else:
        policy, start = ("new" if updates_only else "last_per_subject"), None
    config = OrderedConfig(
        stream=model.stream_name(bucket),
        filter_subject=model.all_meta(bucket),
        deliver_policy=policy,
        start_seq=start,
        idle_heartbeat=idle_heartbeat,
    )
    listener = _Listener(bucket, visible)
    consumer = OrderedConsumer(js, config, listener)
    try:
        await consumer.start()
        while (event := await listener.queue.get()) is not None:
            yield event
    finally:
        await consumer.close()
