"""An object write whose info message went unanswered (504 ``nats.outcome_unknown``) never
leaves an info without its chunks: the server may have stored the info, so the chunks it
names are not purged until the write is settled (its info sent again under the same
``Nats-Msg-Id``: a duplicate says it was stored, a refusal that it was not).

The server is stopped (SIGSTOP) between the object's chunks and its info, so that the info
and what follows it reach the server only once the gateway has answered 504.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import httpx
import nats
import pytest

from app.metrics import Metrics
from app.nats.direct import DirectGet
from app.nats.embedded import EmbeddedServer
from app.nats.jsapi import JetStreamApi
from app.nats.pool import NatsPool
from app.obj.model import ROLLUP, ObjectInfo, chunk_subject, meta_subject
from app.obj.service import ObjService, _InfoUnknown
from tests.helpers import gateway_settings, running_gateway
from tests.integration.test_obj import CHUNK, make_bucket

_TIMEOUT = 1.0  # the gateway's request timeout


async def _stored_messages(nc: nats.NATS, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def _until(check, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    ends = loop.time() + timeout
    while True:
        result = await check()
        if result or loop.time() > ends:
            return result
        await asyncio.sleep(0.05)


async def _unknown_write(
    server: EmbeddedServer,
    gateway: httpx.AsyncClient,
    nc: nats.NATS,
    path: str,
    stream: str,
    body: bytes,
    headers: dict[str, str],
) -> httpx.Response:
    """PUT ``body`` (whole chunks) at ``path``; the server is stopped once its chunks are
    stored and before the body ends (so before the info is sent), and resumed after the
    answer."""
    before = await _stored_messages(nc, stream)
    chunks = len(body) // CHUNK
    ended = asyncio.Event()

    async def upload() -> AsyncIterator[bytes]:
        for at in range(0, len(body), CHUNK):
            yield body[at : at + CHUNK]
        await ended.wait()

    put = asyncio.create_task(gateway.put(path, content=upload(), headers=headers))
    try:
        assert await _until(lambda: _chunks_stored(nc, stream, before + chunks))
        await asyncio.sleep(0.3)  # (their PubAcks reach the gateway)
        os.kill(server.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        ended.set()
        answer = await asyncio.wait_for(put, 4 * _TIMEOUT + 5)
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
    return answer


async def _chunks_stored(nc: nats.NATS, stream: str, count: int) -> bool:
    return await _stored_messages(nc, stream) >= count


@pytest.fixture
async def setup(own_nats_server: EmbeddedServer):  # type: ignore[no-untyped-def]
    settings = gateway_settings(own_nats_server.url, request_timeout=_TIMEOUT)
    async with running_gateway(settings) as gateway:
        nc = await nats.connect(own_nats_server.url)
        try:
            yield own_nats_server, gateway, nc
        finally:
            await nc.close()


async def _reconnected(gateway: httpx.AsyncClient) -> bool:
    """The gateway's NATS connections, dropped when pings went unanswered, are back."""
    return (await gateway.get("/readyz")).status_code == 200


async def test_a_new_object_whose_info_went_unanswered_keeps_its_chunks(setup, name) -> None:  # type: ignore[no-untyped-def]
    server, gateway, nc = setup
    await make_bucket(gateway, name)
    path = f"/v1/obj/{name}/objects/o"
    body = os.urandom(2 * CHUNK)
    answer = await _unknown_write(
        server, gateway, nc, path, f"OBJ_{name}", body, {"If-None-Match": "*"}
    )
    assert answer.status_code == 504, answer.text
    assert answer.json()["code"] == "nats.outcome_unknown"
    assert await _until(lambda: _reconnected(gateway))
    # The info was stored once the server went on: the object is whole, now and later.
    for _ in range(10):
        read = await gateway.get(path)
        assert read.status_code == 200, read.text
        assert read.content == body
        await asyncio.sleep(0.2)


async def test_a_replaced_object_whose_info_went_unanswered_is_one_whole_version(  # type: ignore[no-untyped-def]
    setup, name
) -> None:
    server, gateway, nc = setup
    await make_bucket(gateway, name)
    path = f"/v1/obj/{name}/objects/o"
    first = await gateway.put(path, content=os.urandom(CHUNK + 10))
    assert first.status_code == 201, first.text
    second = os.urandom(2 * CHUNK)
    # (Conditional: nothing is read between the chunks and the info.)
    answer = await _unknown_write(
        server, gateway, nc, path, f"OBJ_{name}", second, {"If-Match": first.headers["etag"]}
    )
    assert answer.status_code == 504, answer.text
    assert await _until(lambda: _reconnected(gateway))
    # The new version's info was stored: it is read whole, and the replaced version's
    # chunks are purged once that is known (2 chunks and 2 infos: the bucket's whole).
    for _ in range(10):
        read = await gateway.get(path)
        assert read.status_code == 200, read.text
        assert read.content == second
        await asyncio.sleep(0.2)
    assert await _until(lambda: _only(nc, f"OBJ_{name}", 2 + 1))


async def _only(nc: nats.NATS, stream: str, count: int) -> bool:
    return await _stored_messages(nc, stream) == count


async def test_a_deleted_object_whose_marker_went_unanswered_loses_its_chunks_once_known(  # type: ignore[no-untyped-def]
    setup, name, monkeypatch
) -> None:
    server, gateway, nc = setup
    await make_bucket(gateway, name)
    path = f"/v1/obj/{name}/objects/o"
    assert (await gateway.put(path, content=os.urandom(CHUNK + 10))).status_code == 201
    stream = f"OBJ_{name}"
    replace = ObjService._replace

    async def stopped_first(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        os.kill(server.pid, signal.SIGSTOP)  # (the info is read: only the marker is sent)
        return await replace(self, *args, **kwargs)

    monkeypatch.setattr(ObjService, "_replace", stopped_first)
    try:
        answer = await asyncio.wait_for(gateway.delete(path), 4 * _TIMEOUT + 5)
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
    monkeypatch.setattr(ObjService, "_replace", replace)
    assert answer.status_code == 504, answer.text
    assert answer.json()["code"] == "nats.outcome_unknown"
    assert await _until(lambda: _reconnected(gateway))
    assert (await gateway.get(path)).status_code == 404
    # The marker is stored: the chunks go once that is known, and only the marker is left.
    assert await _until(lambda: _only(nc, stream, 1))


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
        kept = os.urandom(10)
        assert (await gateway.put(path, content=kept)).status_code == 201
    stream = f"OBJ_{name}"
    pool = NatsPool(settings, [own_nats_server.url], Metrics())
    await pool.start(wait=10)
    nc = await nats.connect(own_nats_server.url)
    try:
        js = JetStreamApi(pool)
        objects = ObjService(js, DirectGet(js))
        current = await objects.current(name, "o")
        assert current is not None
        # A version that lost the race: its chunk stored, its info never.
        lost = ObjectInfo(bucket=name, name="o", nuid="LOSTNUID", size=3, chunks=1)
        await nc.jetstream().publish(chunk_subject(name, "LOSTNUID"), b"abc")
        headers = {
            **ROLLUP,
            "Nats-Expected-Last-Subject-Sequence": str(current.seq - 1),  # (not the last)
            "Nats-Msg-Id": "jsgw-lost",
        }
        unknown = _InfoUnknown(TimeoutError(), meta_subject(name, "o"), lost.wire(), headers, None)
        await objects._settle(
            name,
            "o",
            unknown,
            lambda latest: latest.nuid == "LOSTNUID",
            purge_if_stored=None,
            purge_if_not=chunk_subject(name, "LOSTNUID"),
        )
        assert await _stored_messages(nc, stream) == 2  # the kept version's chunk and info
        assert (await objects.current(name, "o")).nuid == current.nuid  # type: ignore[union-attr]
    finally:
        await nc.close()
        await pool.close()
