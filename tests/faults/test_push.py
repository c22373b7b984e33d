"""Push delivery through gateway processes that die, several replicas and several workers.

Real ``jsgw serve`` processes on the session's nats-server, a real HTTP application in the
test's process (tests/push_app.py), and a NATS subscription of the test's own that sees
every ack. Checked over thousands of messages:

- a gateway killed (SIGKILL) mid-way and started again: every message delivered and acked,
  none acked before the application answered 2xx; the subscription outlives the process
  (it is stored in the bucket);
- two replicas share the consumer and both deliver;
- ``ordered: true``: the pinned replica delivers one at a time in stream order; killed,
  the other takes over after ``priority_timeout`` and the order holds (a message out when
  the pinned one died is delivered again first);
- ``JSGW_WORKERS=2``: a PUT answered by one worker is delivered by both (each worker's
  own counter shows it), and a DELETE stops both.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from prometheus_client.mmap_dict import MmapedDict

from app.nats.embedded import EmbeddedServer
from tests.helpers import jsgw_serve
from tests.push_app import (
    AckWatch,
    Answer,
    PushApp,
    acked_only_after_2xx,
    drained,
    free_port,
    publish,
    until,
)

pytestmark = [pytest.mark.slow, pytest.mark.server("2.11")]

SECRET = "push-faults-shared-secret-0123456789"


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    home: Path

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@contextmanager
def gateway(nats_url: str, bucket: str, home: Path, **extra: str) -> Iterator[Gateway]:
    """One ``jsgw serve``, as one replica of a Deployment runs it."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = {
        "JSGW_NATS_URL": nats_url,
        "JSGW_PORT": str(port),
        "JSGW_ACK_SECRET": SECRET,
        "JSGW_SUBSCRIPTIONS_BUCKET": bucket,
        "JSGW_PUSH_SHUTDOWN_GRACE": "1",
        "JSGW_ACCESS_LOG": "false",
        "JSGW_DATA_DIR": str(home / "data"),
        **extra,
    }
    url = f"http://127.0.0.1:{port}"
    with jsgw_serve(
        settings, home / "gateway.log", ready=f"{url}/readyz", environ={"TMPDIR": str(home)}
    ) as proc:
        yield Gateway(proc, url, home)


@pytest.fixture
def bucket() -> str:
    return f"subs_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A client for any gateway of the test (full URLs), and :func:`on` for one of them."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def on(gw: Gateway) -> httpx.AsyncClient:
    """A client of one gateway (paths relative to it), for tests/push_app's helpers."""
    return httpx.AsyncClient(base_url=gw.url, timeout=30)


async def setup(http: httpx.AsyncClient, url: str, name: str, count: int, nc: nats.NATS) -> None:
    made = await http.put(f"{url}/v1/streams/{name}", json={"subjects": [f"{name}.>"]})
    assert made.status_code == 201, made.text
    if count:
        await publish(nc, f"{name}.orders", count)


async def subscribe(http: httpx.AsyncClient, url: str, name: str, **body: Any) -> None:
    response = await http.put(
        f"{url}/v1/subscriptions/{name}", json={"stream": name, "consumer": "push", **body}
    )
    assert response.status_code == 201, response.text


def delivered_by(text: str, name: str) -> float:
    """``jsgw_push_delivered_total`` of the subscription in a /metrics exposition."""
    match = re.search(
        rf'^jsgw_push_delivered_total{{subscription="{name}"}} (\S+)$', text, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


async def running(http: httpx.AsyncClient, url: str, name: str) -> bool:
    response = await http.get(f"{url}/v1/subscriptions/{name}")
    return response.status_code == 200 and bool(response.json()["state"]["running"])


async def state(http: httpx.AsyncClient, url: str, name: str) -> dict[str, Any]:
    response = await http.get(f"{url}/v1/subscriptions/{name}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["state"]
    return answer


async def test_a_gateway_killed_mid_way_and_started_again(
    nats_server: EmbeddedServer, nc: nats.NATS, http: httpx.AsyncClient, bucket: str,
    name: str, tmp_path: Path,
) -> None:  # fmt: skip
    count = 2000
    async with PushApp(lambda _: Answer(204, delay=0.005)) as app:
        async with AckWatch.on(nc, name, "push") as watch:
            with gateway(nats_server.url, bucket, tmp_path / "first") as first:
                await setup(http, first.url, name, count, nc)
                await subscribe(
                    http,
                    first.url,
                    name,
                    endpoint=app.url,
                    concurrency=32,
                    consumer_config={"ack_wait": "2s"},
                )
                await until(lambda: app.ok.total() >= 700, 30, "700 messages delivered")
                first.kill()
                at_kill = app.ok.total()
            # The subscription is in the bucket: a new process delivers the rest.
            with gateway(nats_server.url, bucket, tmp_path / "second") as second:
                async with on(second) as client:
                    await drained(client, name, "push", timeout=40)
                seen = await state(http, second.url, name)
        assert all(app.ok[seq] >= 1 for seq in range(1, count + 1))
        assert acked_only_after_2xx(app, watch) == []
    assert at_kill < count and seen["acked"] > 0, (at_kill, seen)
    # The messages the killed process held came back after ack_wait.
    again = [r.seq for r in app.received if r.delivered > 1]
    print(f"\n{at_kill} answered before the kill; {len(again)} delivered again after it")


async def test_two_replicas_share_the_consumer(
    nats_server: EmbeddedServer, nc: nats.NATS, http: httpx.AsyncClient, bucket: str,
    name: str, tmp_path: Path,
) -> None:  # fmt: skip
    count = 2000
    with (
        gateway(nats_server.url, bucket, tmp_path / "a") as a,
        gateway(nats_server.url, bucket, tmp_path / "b") as b,
    ):
        await setup(http, a.url, name, 0, nc)
        async with (
            PushApp(lambda _: Answer(204, delay=0.005)) as app,
            AckWatch.on(nc, name, "push") as watch,
        ):
            # Made through A; B delivers it too (it watches the same bucket): once both
            # pull, the messages come.
            await subscribe(http, a.url, name, endpoint=app.url, concurrency=16)
            for replica in (a, b):
                await until(
                    lambda r=replica: running(http, r.url, name), 10, f"{replica.home.name} pulls"
                )
            await publish(nc, f"{name}.orders", count)
            async with on(b) as client:
                await drained(client, name, "push", timeout=40)
            assert all(app.ok[seq] >= 1 for seq in range(1, count + 1))
            assert acked_only_after_2xx(app, watch) == []
        by_a = delivered_by((await http.get(f"{a.url}/metrics")).text, name)
        by_b = delivered_by((await http.get(f"{b.url}/metrics")).text, name)
    assert by_a > 0 and by_b > 0, (by_a, by_b)
    assert by_a + by_b == len(app.received)
    print(f"\nreplica A delivered {by_a:.0f}, replica B {by_b:.0f}")


async def test_ordered_delivery_keeps_stream_order_across_a_fail_over(
    nats_server: EmbeddedServer, nc: nats.NATS, http: httpx.AsyncClient, bucket: str,
    name: str, tmp_path: Path,
) -> None:  # fmt: skip
    count = 2000
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(gateway(nats_server.url, bucket, tmp_path / label))
            for label in ("a", "b")
        ]
        await setup(http, replicas[0].url, name, count, nc)
        async with PushApp() as app, AckWatch.on(nc, name, "push") as watch:
            await subscribe(
                http,
                replicas[0].url,
                name,
                endpoint=app.url,
                ordered=True,
                consumer_config={"ack_wait": "3s", "priority_timeout": "2s"},
            )
            await until(lambda: app.ok.total() >= 700, 30, "700 messages delivered")
            counts = [
                delivered_by((await http.get(f"{r.url}/metrics")).text, name) for r in replicas
            ]
            # One replica at a time is pinned, and only it delivers.
            assert sorted(bool(c) for c in counts) == [False, True], counts
            pinned = replicas[counts.index(max(counts))]
            other = replicas[1 - replicas.index(pinned)]
            pinned.kill()
            killed_at = len(app.received)
            async with on(other) as client:
                await drained(client, name, "push", timeout=40)
            assert acked_only_after_2xx(app, watch) == []
        taken_over = delivered_by((await http.get(f"{other.url}/metrics")).text, name)
    order = [request.seq for request in app.received]
    # In stream order: each message is the one after the last, or the last again (it was
    # out when the pinned replica died, and nothing after it was delivered before it).
    steps = [b - a for a, b in itertools.pairwise(order)]
    assert order[0] == 1 and order[-1] == count
    assert set(steps) <= {0, 1}, [(i, s) for i, s in enumerate(steps) if s not in (0, 1)][:5]
    assert taken_over >= count - killed_at, (taken_over, killed_at)
    print(f"\nfail-over after {killed_at} deliveries; repeated: {steps.count(0)}")


async def test_two_workers_both_deliver_a_put_and_stop_on_delete(
    nats_server: EmbeddedServer, nc: nats.NATS, http: httpx.AsyncClient, bucket: str,
    name: str, tmp_path: Path,
) -> None:  # fmt: skip
    count = 2000
    with gateway(nats_server.url, bucket, tmp_path / "w", JSGW_WORKERS="2") as served:
        await setup(http, served.url, name, 0, nc)
        async with (
            PushApp(lambda _: Answer(204, delay=0.005)) as app,
            AckWatch.on(nc, name, "push") as watch,
        ):
            await subscribe(http, served.url, name, endpoint=app.url, concurrency=8)
            # The worker that did not answer hears of it through the bucket (no way to ask
            # it alone: give it the moment that takes), then the messages come.
            await asyncio.sleep(1)
            await publish(nc, f"{name}.orders", count)
            async with on(served) as client:
                await drained(client, name, "push", timeout=40)
            assert all(app.ok[seq] >= 1 for seq in range(1, count + 1))
            assert acked_only_after_2xx(app, watch) == []
            per_worker = _delivered_per_worker(served.home, name)
            assert len(per_worker) == 2 and all(per_worker.values()), per_worker
            assert sum(per_worker.values()) == len(app.received)
            # Deleted through whichever worker answers: neither delivers any more (the other
            # one hears of it through the bucket, a moment later).
            deleted = await http.delete(f"{served.url}/v1/subscriptions/{name}")
            assert deleted.status_code == 204
            await asyncio.sleep(1)
            before = len(app.received)
            await publish(nc, f"{name}.orders", 200)
            await asyncio.sleep(1.5)
            assert len(app.received) == before
            left = await http.get(f"{served.url}/v1/streams/{name}/consumers/push")
            assert left.json()["num_pending"] == 200
    print(f"\ndelivered per worker: {per_worker}")


def _delivered_per_worker(home: Path, name: str) -> dict[str, float]:
    """What each worker's own counter file holds for the subscription (multiprocess mode)."""
    (folder,) = home.glob("jsgw-metrics-*")
    counted: dict[str, float] = {}
    for file in folder.glob("counter_*.db"):
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(file)):
            if key.startswith('["jsgw_push_delivered"') and f'"{name}"' in key and value:
                counted[file.name] = counted.get(file.name, 0.0) + value
    return counted
