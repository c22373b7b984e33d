"""Several gateway replicas on one 3-node JetStream cluster: nothing has to be sticky.

Two real ``jsgw serve`` processes, A connected to node n1 and B to node n2, share the auth file
and ``JSGW_ACK_SECRET`` (what docs/deployment.md asks of replicas). A client may reach either one
for any request:

- a KV watch through A (with an SSE token minted by B) sees the writes made through B, and
  resumes through B from the last event A sent;
- messages fetched through A are acked through B with A's ack tokens, and are not redelivered;
- a pin taken through A is honoured by B: a pull through B with the pin gets the messages, one
  without it is held while the pin is valid.

A third gateway C, on node n3 with the same auth file but another ack secret, refuses A's ack
tokens and SSE tokens: the secret is what makes them portable.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cluster import Cluster
from tests.helpers import jsgw_serve, problem
from tests.integration.test_kv_watch import SSE

pytestmark = pytest.mark.slow

SHARED_SECRET = "replicas-test-shared-secret-0123456789"
OTHER_SECRET = "replicas-test-other-secret-9876543210"
TOKEN = "replica-admin-token-0123456789"
POLICY = f"""
tokens:
  - name: admin
    token: "{TOKEN}"
    rules:
      - {{resource: "stream:*", actions: [read, write, admin]}}
      - {{resource: "kv:*", actions: [read, write, admin]}}
      - {{resource: "consumer:*/*", actions: [admin, consume]}}
"""
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _replica(
    name: str, nats_url: str, secret: str, auth_file: Path, tmp: Path
) -> Iterator[Replica]:
    """``jsgw serve`` as its own process, as one replica of a Deployment would run."""
    port = _free_port()
    home = tmp / name
    home.mkdir()
    settings = {
        "JSGW_NATS_URL": nats_url,
        "JSGW_PORT": str(port),
        "JSGW_ACK_SECRET": secret,
        "JSGW_AUTH_FILE": str(auth_file),
        "JSGW_DATA_DIR": str(home / "data"),
        "JSGW_REQUEST_TIMEOUT": "5",
        "JSGW_KV_WATCH_HEARTBEAT": "0.5",
        "JSGW_ACCESS_LOG": "false",
    }
    log = home / "gateway.log"
    url = f"http://127.0.0.1:{port}"
    with jsgw_serve(settings, log, ready=f"{url}/readyz", environ={"TMPDIR": str(home)}) as proc:
        yield Replica(name, proc, url, log)


@dataclass
class Replicas:
    a: httpx.AsyncClient  # on n1
    b: httpx.AsyncClient  # on n2, same secret as A
    c: httpx.AsyncClient  # on n3, another secret


@pytest.fixture(scope="module")
def replica_processes(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replica, Replica, Replica]]:
    """A, B and C, started once for the module: each test uses names of its own, and what
    it checks is carried by the requests (tokens, pins, resume points), not kept per test."""
    tmp = tmp_path_factory.mktemp("replicas")
    auth_file = tmp / "auth.yaml"
    auth_file.write_text(POLICY)
    n1, n2, n3 = cluster.urls
    with (
        _replica("a", n1, SHARED_SECRET, auth_file, tmp) as a,
        _replica("b", n2, SHARED_SECRET, auth_file, tmp) as b,
        _replica("c", n3, OTHER_SECRET, auth_file, tmp) as c,
    ):
        yield a, b, c


@pytest.fixture
async def replicas(
    healed: Cluster, replica_processes: tuple[Replica, Replica, Replica]
) -> AsyncIterator[Replicas]:
    a, b, c = replica_processes
    for replica in replica_processes:  # (a replica that died in an earlier test shows here)
        assert replica.proc.poll() is None, replica.log.read_text()
    async with (
        httpx.AsyncClient(base_url=a.url, headers=BEARER, timeout=15) as ha,
        httpx.AsyncClient(base_url=b.url, headers=BEARER, timeout=15) as hb,
        httpx.AsyncClient(base_url=c.url, headers=BEARER, timeout=15) as hc,
    ):
        yield Replicas(ha, hb, hc)


def _unique(prefix: str) -> str:
    return f"{prefix}{time.monotonic_ns() % 10**9}"


async def _sse_token(gateway: httpx.AsyncClient) -> str:
    minted = await gateway.post("/v1/auth/sse-token")
    assert minted.status_code == 200, minted.text
    return str(minted.json()["token"])


@asynccontextmanager
async def _watching(
    gateway: httpx.AsyncClient, bucket: str, token: str, headers: dict[str, str] | None = None
) -> AsyncIterator[SSE]:
    """A watch as a browser's EventSource opens it: no Authorization, the SSE token in the query."""
    url = f"{str(gateway.base_url).rstrip('/')}/v1/kv/{bucket}/watch"
    async with (
        httpx.AsyncClient(timeout=15) as browser,
        browser.stream("GET", url, params={"access_token": token}, headers=headers) as response,
    ):
        assert response.status_code == 200, (await response.aread()).decode()
        yield SSE(response)


async def _put(gateway: httpx.AsyncClient, bucket: str, key: str, value: bytes) -> int:
    response = await gateway.put(f"/v1/kv/{bucket}/keys/{key}", content=value)
    assert response.status_code == 200, response.text
    return int(response.json()["revision"])


async def test_a_watch_on_one_replica_sees_writes_through_the_other(replicas: Replicas) -> None:
    bucket = _unique("REPL_KV_")
    created = await replicas.a.put(f"/v1/kv/{bucket}", json={"history": 5, "replicas": 3})
    assert created.status_code == 201, created.text
    first = await _put(replicas.b, bucket, "k", b"before")

    token = await _sse_token(replicas.b)  # minted by B, used on A
    async with _watching(replicas.a, bucket, token) as sse:
        initial = await sse.until("ready", timeout=10)
        assert [(e.event, e.id) for e in initial] == [("put", str(first)), ("ready", str(first))]
        written = [await _put(replicas.b, bucket, f"k{i}", f"v{i}".encode()) for i in range(3)]
        seen = [await sse.next(timeout=10) for _ in written]
        assert [(e.event, e.id, e.json["key"]) for e in seen] == [
            ("put", str(rev), f"k{i}") for i, rev in enumerate(written)
        ]
        last_id = seen[-1].id
    assert last_id is not None

    # The browser reconnects and lands on B: it resumes from A's last event, nothing twice.
    later = await _put(replicas.a, bucket, "k", b"while away")
    async with _watching(replicas.b, bucket, token, {"Last-Event-ID": last_id}) as sse:
        events = [await sse.next(timeout=10)]
        while events[-1].event != "put":
            events.append(await sse.next(timeout=10))
        resumed = [(e.event, e.id, e.json["key"]) for e in events if e.event != "ready"]
        assert resumed == [("put", str(later), "k")]


async def _stream_with_consumer(gateway: httpx.AsyncClient, stream: str, **config: object) -> str:
    prefix = stream.lower()
    body = {"subjects": [f"{prefix}.>"], "num_replicas": 3}
    created = await gateway.put(f"/v1/streams/{stream}", json=body)
    assert created.status_code == 201, created.text
    consumer = await gateway.put(f"/v1/streams/{stream}/consumers/C", json=config)
    assert consumer.status_code == 201, consumer.text
    return prefix


async def _publish(gateway: httpx.AsyncClient, prefix: str, count: int) -> None:
    for i in range(count):
        response = await gateway.post(f"/v1/publish/{prefix}.{i}", content=f"m{i}".encode())
        assert response.status_code == 200, response.text


async def _fetch(
    gateway: httpx.AsyncClient, stream: str, pin: str | None = None, **body: object
) -> httpx.Response:
    headers = {"Nats-Pin-Id": pin} if pin else {}
    response = await gateway.post(
        f"/v1/streams/{stream}/consumers/C/fetch", json=body, headers=headers
    )
    assert response.status_code == 200, response.text
    return response


async def _ack(gateway: httpx.AsyncClient, stream: str, tokens: list[str]) -> httpx.Response:
    return await gateway.post(
        f"/v1/streams/{stream}/consumers/C/ack", json={"acks": [{"token": t} for t in tokens]}
    )


async def _consumer(gateway: httpx.AsyncClient, stream: str) -> dict:
    response = await gateway.get(f"/v1/streams/{stream}/consumers/C")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_fetched_through_one_replica_acked_through_the_other(replicas: Replicas) -> None:
    stream = _unique("REPL_ACK_")
    prefix = await _stream_with_consumer(replicas.a, stream, ack_wait="4s")
    await _publish(replicas.b, prefix, 5)

    fetched = (await _fetch(replicas.a, stream, max_messages=5, expires=2)).json()["messages"]
    assert [m["seq"] for m in fetched] == [1, 2, 3, 4, 5]
    tokens = [m["ack_token"] for m in fetched]

    # C signs with another secret: A's tokens are not its own, and nothing is acked.
    refused = problem(await _ack(replicas.c, stream, tokens), 400, "ack.token_invalid")
    assert "acks[0]" in refused["detail"]
    assert (await _consumer(replicas.a, stream))["num_ack_pending"] == 5

    acked = await _ack(replicas.b, stream, tokens)
    assert acked.status_code == 200, acked.text
    assert [(r["ok"], r["seq"]) for r in acked.json()["results"]] == [
        (True, seq) for seq in range(1, 6)
    ]
    for gateway in (replicas.a, replicas.b):
        state = await _consumer(gateway, stream)
        assert (state["num_ack_pending"], state["num_redelivered"]) == (0, 0), state

    # Past ack_wait, nothing comes back, through either replica.
    await asyncio.sleep(4.5)
    for gateway in (replicas.a, replicas.b):
        again = await _fetch(gateway, stream, max_messages=5, expires=1)
        assert again.json()["messages"] == []
    assert (await _consumer(replicas.b, stream))["num_redelivered"] == 0


@pytest.mark.server("2.11")  # priority groups
async def test_a_pin_taken_through_one_replica_is_honoured_by_the_other(
    replicas: Replicas,
) -> None:
    stream = _unique("REPL_PIN_")
    prefix = await _stream_with_consumer(
        replicas.a,
        stream,
        priority_groups=["jobs"],
        priority_policy="pinned_client",
        priority_timeout=10,
    )
    await _publish(replicas.a, prefix, 3)

    first = await _fetch(replicas.a, stream, group="jobs", expires=1)
    pin = first.json()["pin_id"]
    assert pin and first.headers["nats-pin-id"] == pin
    assert [m["seq"] for m in first.json()["messages"]] == [1]
    acked = await _ack(replicas.b, stream, [first.json()["messages"][0]["ack_token"]])
    assert acked.status_code == 200, acked.text

    async def pinned_pull() -> httpx.Response:
        await asyncio.sleep(0.3)  # the unpinned pull is already waiting
        return await _fetch(replicas.b, stream, pin=pin, group="jobs", expires=2)

    other, pinned = await asyncio.gather(
        _fetch(replicas.b, stream, group="jobs", expires=2), pinned_pull()
    )
    assert other.json()["messages"] == [], other.json()  # held: B knows the pin is A's client's
    assert "pin_id" not in other.json() and "nats-pin-id" not in other.headers
    assert [m["seq"] for m in pinned.json()["messages"]] == [2]
    assert pinned.json()["pin_id"] == pin and pinned.headers["nats-pin-id"] == pin

    # And back on A, the same pin still pulls; the consumer names it through either replica.
    back = await _fetch(replicas.a, stream, pin=pin, group="jobs", expires=1)
    assert [m["seq"] for m in back.json()["messages"]] == [3]
    for gateway in (replicas.a, replicas.b):
        groups = (await _consumer(gateway, stream))["priority_groups"]
        assert groups[0]["pinned_client_id"] == pin


async def test_tokens_of_a_replica_with_another_secret_are_refused(replicas: Replicas) -> None:
    """The SSE token, like the ack token, is signed with JSGW_ACK_SECRET (a key derived from it)."""
    bucket = _unique("REPL_SSE_")
    created = await replicas.a.put(f"/v1/kv/{bucket}", json={"replicas": 3})
    assert created.status_code == 201, created.text
    token = await _sse_token(replicas.a)
    async with httpx.AsyncClient(base_url=str(replicas.c.base_url), timeout=15) as browser:
        refused = await browser.get(f"/v1/kv/{bucket}/watch", params={"access_token": token})
        problem(refused, 401)
    async with _watching(replicas.c, bucket, await _sse_token(replicas.c)) as sse:
        assert (await sse.next(timeout=10)).event == "ready"  # C's own token works
