"""Object bucket watches (SSE), access rules (obj: grants) and the transfer metrics."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway, served_gateway
from tests.integration.test_kv_watch import SSE
from tests.integration.test_obj import CHUNK, make_bucket


@pytest.fixture(scope="module")
def url(nats_server: EmbeddedServer) -> Iterator[str]:
    settings = gateway_settings(nats_server.url, sse_heartbeat=0.5)
    with served_gateway(settings) as served:
        yield served


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http


@asynccontextmanager
async def watching(
    client: httpx.AsyncClient, bucket: str, headers: dict[str, str] | None = None, **params: str
) -> AsyncIterator[SSE]:
    async with client.stream("GET", f"/v1/obj/{bucket}/watch", params=params, headers=headers) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        yield SSE(r)


async def test_watch_current_ready_changes_and_resume(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(client, name)
    await client.put(f"/v1/obj/{name}/objects/a", content=b"1")
    await client.put(f"/v1/obj/{name}/objects/b", content=b"22")
    await client.put(f"/v1/obj/{name}/objects/a", content=b"333")  # a's latest only
    async with watching(client, name) as sse:
        first, second, ready = await sse.next(), await sse.next(), await sse.next()
        assert [e.event for e in (first, second, ready)] == ["info", "info", "ready"]
        assert {(e.json["name"], e.json["size"]) for e in (first, second)} == {("a", 3), ("b", 2)}
        # A change by nats-py shows too, then a delete by the gateway.
        store = await nc.jetstream().object_store(name)
        await store.put("c", b"from nats-py")
        change = await sse.next()
        assert (change.event, change.json["name"], change.json["size"]) == ("info", "c", 12)
        assert (await client.delete(f"/v1/obj/{name}/objects/b")).status_code == 204
        deleted = await sse.next()
        assert deleted.json["name"] == "b" and deleted.json["deleted"] is True
    # Resumed after the change: only what came after it, then ready.
    await client.put(f"/v1/obj/{name}/objects/d", content=b"4")
    async with watching(client, name, {"Last-Event-ID": change.id or ""}) as sse:
        after = [await sse.next() for _ in range(3)]
    assert [(e.event, e.json.get("name")) for e in after] == [
        ("info", "b"),
        ("info", "d"),
        ("ready", None),
    ]
    async with watching(client, name, updates_only="true") as sse:
        assert (await sse.next()).event == "ready"
        await client.put(f"/v1/obj/{name}/objects/e", content=b"5")
        assert (await sse.next()).json["name"] == "e"
    problem(await client.get("/v1/obj/NOPE_NONE/watch"), 404, "obj.bucket_not_found")
    bad = await client.get(f"/v1/obj/{name}/watch", headers={"Last-Event-ID": "x"})
    problem(bad, 400)


async def test_watch_ends_when_the_bucket_is_deleted(client: httpx.AsyncClient, name: str) -> None:
    await make_bucket(client, name)
    async with watching(client, name) as sse:
        assert (await sse.next()).event == "ready"
        assert (await client.delete(f"/v1/obj/{name}")).status_code == 204
        end = await sse.next(timeout=10)
        assert end.event == "error" and end.json["code"] == "obj.bucket_not_found"


async def test_transfer_metrics_by_route_template(client: httpx.AsyncClient, name: str) -> None:
    await make_bucket(client, name)
    data = os.urandom(CHUNK + 10)

    def counted(text: str, direction: str) -> float:
        prefix = (
            f'jsgw_obj_bytes_total{{direction="{direction}",'
            'route="/v1/obj/{bucket}/objects/{name}"}'
        )
        values = [
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
        ]
        return values[0] if values else 0.0

    before = (await client.get("/metrics")).text
    await client.put(f"/v1/obj/{name}/objects/secret-name", content=data)
    await client.get(f"/v1/obj/{name}/objects/secret-name")
    await client.get(f"/v1/obj/{name}/objects/secret-name", headers={"Range": "bytes=0-99"})
    after = (await client.get("/metrics")).text
    assert counted(after, "in") - counted(before, "in") == len(data)
    assert counted(after, "out") - counted(before, "out") == len(data) + 100
    assert "secret-name" not in after and name not in after


READER, WRITER = "obj-reader-0123456789abcdef", "obj-writer-0123456789abcdef"


@pytest.fixture
def auth_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "auth.json"
    rules = {
        READER: [
            {"resource": f"obj:{name}", "actions": ["read"]},
            {"resource": f"obj:{name}/private/", "actions": []},
            {"resource": "stream:*", "actions": ["read"]},
        ],
        WRITER: [
            {"resource": f"obj:{name}/inbox/", "actions": ["write", "read"]},
        ],
    }
    tokens = [{"name": t[:10], "token": t, "rules": r} for t, r in rules.items()]
    tokens.append(
        {
            "name": "admin",
            "token": "obj-admin-0123456789abcdef",
            "rules": [
                {"resource": "obj:*", "actions": ["admin", "read", "write"]},
            ],
        }
    )
    path.write_text(json.dumps({"tokens": tokens}))
    return path


async def test_obj_grants(nats_server: EmbeddedServer, auth_file: Path, name: str) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    async with running_gateway(settings) as gw:

        def as_(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        admin = as_("obj-admin-0123456789abcdef")
        assert (await gw.put(f"/v1/obj/{name}", headers=admin)).status_code == 201
        for obj in ("a", "private/plan", "inbox/x"):
            response = await gw.put(f"/v1/obj/{name}/objects/{obj}", content=b"v", headers=admin)
            assert response.status_code == 201
        reader, writer = as_(READER), as_(WRITER)
        # Default deny: no token, or a token without a rule for the bucket.
        problem(await gw.get(f"/v1/obj/{name}/objects/a"), 401)
        problem(await gw.put(f"/v1/obj/{name}", headers=reader), 403, "auth.forbidden")
        assert (await gw.get(f"/v1/obj/{name}/objects/a", headers=reader)).content == b"v"
        problem(await gw.get(f"/v1/obj/{name}/objects/private/plan", headers=reader), 403)
        problem(await gw.put(f"/v1/obj/{name}/objects/a", content=b"w", headers=reader), 403)
        listed = (await gw.get(f"/v1/obj/{name}/objects", headers=reader)).json()["objects"]
        assert sorted(o["name"] for o in listed) == ["a", "inbox/x"]
        # The bucket's stream is not a way around the obj: rules (as kv: rules bind KV_).
        problem(await gw.get(f"/v1/streams/OBJ_{name}/messages/1", headers=reader), 403)
        # A writer under a prefix: writes and reads there, nothing else.
        put = await gw.put(f"/v1/obj/{name}/objects/inbox/y", content=b"y", headers=writer)
        assert put.status_code == 201
        problem(await gw.put(f"/v1/obj/{name}/objects/b", content=b"y", headers=writer), 403)
        problem(await gw.get(f"/v1/obj/{name}/objects/a", headers=writer), 403)
        assert (
            await gw.delete(f"/v1/obj/{name}/objects/inbox/y", headers=writer)
        ).status_code == 204
        listed = (await gw.get(f"/v1/obj/{name}/objects", headers=writer)).json()["objects"]
        assert [o["name"] for o in listed] == ["inbox/x"]
        buckets = (await gw.get("/v1/obj", headers=writer)).json()["buckets"]
        assert [b["bucket"] for b in buckets] == [name]
