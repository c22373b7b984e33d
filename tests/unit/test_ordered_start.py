"""Where an ordered consumer says its listener starts from when nothing is pending: the
stream's last sequence only from a consumer on the server that led the stream (R1 consumers
are placed on any replica, and one behind speaks for itself only)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from app.nats.ordered import OrderedConfig, OrderedConsumer


class Sub:
    async def unsubscribe(self) -> None:
        pass


class Client:
    def new_inbox(self) -> str:
        return "_INBOX.x"

    async def subscribe(self, subject: str, cb: Any = None) -> Sub:
        return Sub()


class JetStream:
    """The stream's info from its leader ``stream_on``; the consumer made on ``consumer_on``,
    which has the stream up to ``has``."""

    def __init__(self, stream_on: str | None, consumer_on: str | None, has: int) -> None:
        client = Client()

        async def confirm(*_: Any) -> None:
            pass

        self.pool = SimpleNamespace(pick=lambda: client, confirm=confirm)
        self.stream_on, self.consumer_on, self.has = stream_on, consumer_on, has

    async def call(self, operation: str, *tokens: str, **_: Any) -> dict[str, Any]:
        if operation == "stream.info":
            info = {"created": "t", "state": {"last_seq": 90}}
            if self.stream_on:
                info["cluster"] = {"leader": self.stream_on}
            return info
        if operation == "consumer.create":
            info = {"name": "C", "num_pending": 0, "delivered": {"stream_seq": self.has}}
            if self.consumer_on:
                info["cluster"] = {"leader": self.consumer_on}
            return info
        return {}


class Listener:
    def __init__(self) -> None:
        self.started: list[tuple[int, int]] = []

    def on_start(self, num_pending: int, position: int) -> None:
        self.started.append((num_pending, position))

    def on_message(self, message: Any) -> None:
        pass

    def on_error(self, error: Any) -> None:
        pass


async def started_at(js: JetStream, policy: str = "new") -> int:
    listener = Listener()
    consumer = OrderedConsumer(js, OrderedConfig("KV_B", "$KV.B.>", policy), listener)  # type: ignore[arg-type]
    await consumer.start()
    await consumer.close()
    await asyncio.sleep(0)
    [(pending, position)] = listener.started
    assert pending == 0
    return position


async def test_a_consumer_on_the_stream_leader_starts_at_the_stream_s_last_sequence() -> None:
    assert await started_at(JetStream("n1", "n1", has=70), "last_per_subject") == 90
    # a lone server: the stream's info names it, the consumer's names no cluster
    assert await started_at(JetStream("n1", None, has=0), "last_per_subject") == 90


async def test_a_consumer_on_another_replica_starts_where_it_says_it_is() -> None:
    # The replica has the stream up to 70 ("new" starts there); the leader had 90.
    assert await started_at(JetStream("n1", "n2", has=70)) == 70
    assert await started_at(JetStream("n1", "n2", has=0), "last_per_subject") == 0


async def test_a_replica_answering_for_a_stream_without_leader_is_not_believed() -> None:
    # (a stream whose replicas have no leader: any answers its info, naming no leader)
    assert await started_at(JetStream(None, "n2", has=70)) == 70
