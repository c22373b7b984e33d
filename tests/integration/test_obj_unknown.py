"""An object write whose info message went unanswered (504 ``nats.outcome_unknown``) never
leaves an info without its chunks: the server may have stored the info, so nothing it could
name is purged until the write is settled in the background (its info sent again as it was,
then the stream leader's latest info read), and then what no info names is purged.

The server is stopped (SIGSTOP) right before the info is sent, after the chunks are stored
and the version to replace is read, and resumed once the gateway has answered 504: the info
(and the purges that followed it before this change) reach the server only then.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import nats
import pytest

from app.metrics import Metrics
from app.nats.direct import DirectGet
from app.nats.embedded import EmbeddedServer
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.obj import service
from app.obj.model import ROLLUP, ObjectInfo, chunk_subject, meta_subject
from app.obj.service import ObjService, _InfoUnknown
from tests.helpers import gateway_settings, running_gateway
from tests.integration.test_obj import CHUNK, make_bucket

_TIMEOUT = 1.0  # the gateway's request timeout

Setup = tuple[EmbeddedServer, httpx.AsyncClient, nats.NATS]


@pytest.fixture
async def setup(own_nats_server: EmbeddedServer) -> AsyncIterator[Setup]:
    settings = gateway_settings(own_nats_server.url, request_timeout=_TIMEOUT)
    async with running_gateway(settings) as gateway:
        nc = await nats.connect(own_nats_server.url)
        try:
            yield own_nats_server, gateway, nc
        finally:
            await nc.close()


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> bool:
    loop = asyncio.get_running_loop()
    ends = loop.time() + timeout
    while not await check():
        if loop.time() > ends:
            return False
        await asyncio.sleep(0.05)
    return True


async def _messages(nc: nats.NATS, stream: str) -> dict[str, int]:
    """The stream's messages by subject."""
    info = await nc.jetstream().stream_info(stream, subjects_filter=">")
    return dict(info.state.subjects or {})


async def _unanswered(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, write: Awaitable[httpx.Response]
) -> httpx.Response:
    """``write``'s answer, the server stopped from right before its info is sent until the
    answer came; returned once the gateway is connected again."""
    server, gateway, _ = setup
    replace = ObjService._replace

    async def stopped_first(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _stop(server.pid)  # type: ignore[arg-type]
        return await replace(self, *args, **kwargs)

    monkeypatch.setattr(ObjService, "_replace", stopped_first)
    try:
        answer = await asyncio.wait_for(write, 4 * _TIMEOUT + 5)
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
        monkeypatch.setattr(ObjService, "_replace", replace)
    assert answer.status_code == 504, answer.text
    assert answer.json()["code"] == "nats.outcome_unknown"
    # (Its NATS connections, dropped when pings went unanswered, come back.)
    assert await _until(lambda: _ready(gateway))
    return answer


async def _with_object(gateway: httpx.AsyncClient, name: str) -> str:
    """A bucket holding object "o" of two chunks: its path."""
    await make_bucket(gateway, name)
    path = f"/v1/obj/{name}/objects/o"
    assert (await gateway.put(path, content=os.urandom(CHUNK + 10))).status_code == 201
    return path


def _stop(pid: int) -> None:
    """SIGSTOP, and until every thread of the process is stopped (a thread running on
    another core goes on for a moment: long enough to answer what is sent at once)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        if all(state == "T" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"nats-server {pid} did not stop")


async def _ready(gateway: httpx.AsyncClient) -> bool:
    return (await gateway.get("/readyz")).status_code == 200


async def _whole(gateway: httpx.AsyncClient, path: str, body: bytes) -> None:
    """The object reads whole, now and for a while (past the write's settling)."""
    for _ in range(15):
        read = await gateway.get(path)
        assert read.status_code == 200, read.text
        assert read.content == body
        await asyncio.sleep(0.2)


async def test_a_new_object_whose_info_went_unanswered_keeps_its_chunks(
    setup: Setup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gateway, nc = setup
    await make_bucket(gateway, name)
    path = f"/v1/obj/{name}/objects/o"
    body = os.urandom(2 * CHUNK)
    await _unanswered(
        setup, monkeypatch, gateway.put(path, content=body, headers={"If-None-Match": "*"})
    )
    # The info was stored once the server went on: the object is whole, now and later.
    await _whole(gateway, path, body)
    assert sum((await _messages(nc, f"OBJ_{name}")).values()) == 3  # 2 chunks, 1 info


async def test_a_replaced_object_whose_info_went_unanswered_is_one_whole_version(
    setup: Setup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gateway, nc = setup
    path = await _with_object(gateway, name)
    second = os.urandom(2 * CHUNK)
    await _unanswered(setup, monkeypatch, gateway.put(path, content=second))
    await _whole(gateway, path, second)
    # Once the write is settled, the replaced version's chunks are purged: 2 chunks, 1 info.
    assert await _until(lambda: _count(nc, f"OBJ_{name}", 3))


async def test_a_retry_after_an_unanswered_info_leaves_only_its_own_version(
    setup: Setup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unanswered version was stored, and a retry replaced it (purging its chunks)
    before it was settled: the settling finds a third version in use and purges the first
    version's chunks, which nothing else would."""
    _, gateway, nc = setup
    monkeypatch.setattr(service, "_SETTLE_PAUSES", (3, 6))  # (the retry comes first)
    path = await _with_object(gateway, name)
    await _unanswered(setup, monkeypatch, gateway.put(path, content=os.urandom(CHUNK)))
    third = os.urandom(CHUNK + 20)
    assert (await gateway.put(path, content=third)).status_code == 200
    assert await _until(lambda: _count(nc, f"OBJ_{name}", 3))  # 2 chunks, 1 info
    await _whole(gateway, path, third)


async def test_a_deleted_object_whose_marker_went_unanswered_loses_its_chunks_once_known(
    setup: Setup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gateway, nc = setup
    path = await _with_object(gateway, name)
    await _unanswered(setup, monkeypatch, gateway.delete(path))
    assert (await gateway.get(path)).status_code == 404
    # The marker is stored: the chunks go once that is known, and only the marker is left.
    assert await _until(lambda: _count(nc, f"OBJ_{name}", 1))


async def _count(nc: nats.NATS, stream: str, count: int) -> bool:
    return sum((await _messages(nc, stream)).values()) == count


async def test_an_info_found_not_stored_has_its_own_chunks_purged(
    own_nats_server: EmbeddedServer, name: str
) -> None:
    """The other outcome: the info sent again is refused for its expected sequence, and the
    leader's latest info is another version's, so this write's chunks are purged and the
    other version stays whole."""
    settings = gateway_settings(own_nats_server.url, request_timeout=_TIMEOUT)
    async with running_gateway(settings) as gateway:
        await make_bucket(gateway, name)
        path = f"/v1/obj/{name}/objects/o"
        assert (await gateway.put(path, content=os.urandom(10))).status_code == 201
    stream = f"OBJ_{name}"
    pool = NatsPool(settings, [own_nats_server.url], Metrics())
    await pool.start(wait=10)
    nc = await nats.connect(own_nats_server.url)
    try:
        js = JetStreamApi(pool)
        objects = ObjService(js, DirectGet(js))
        kept = await objects.current(name, "o")
        assert kept is not None
        # A version that lost the race: its chunk stored, its info never (it was to
        # replace a version before the kept one: its expected sequence is not the last).
        lost = ObjectInfo(bucket=name, name="o", nuid="LOSTNUID", size=3, chunks=1)
        await nc.jetstream().publish(chunk_subject(name, "LOSTNUID"), b"abc")
        headers = {
            **ROLLUP,
            "Nats-Expected-Last-Subject-Sequence": "0",
            "Nats-Msg-Id": "jsgw-lost",
        }
        unknown = _InfoUnknown(TimeoutError(), meta_subject(name, "o"), lost.wire(), headers, None)
        await objects._settle(name, "o", unknown, own="LOSTNUID")
        assert sum((await _messages(nc, stream)).values()) == 2  # the kept chunk and info
        assert (await objects.current(name, "o")).nuid == kept.nuid  # type: ignore[union-attr]
    finally:
        await nc.close()
        await pool.close()
