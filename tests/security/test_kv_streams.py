"""A bucket's keys are a stream's messages too (``KV_<bucket>``, subjects
``$KV.<bucket>.<key>``): what a token's kv: rules deny stays denied through the stream routes
(Direct Get, messages by sequence, multi reads, stream administration, consumers), whatever
its stream: rules grant. Against a real nats-server, with an auth file.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from app.auth import access
from app.auth.policy import Pattern, Principal, Resource, Rule
from app.errors import GatewayError
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway

ADMIN = "admin-token-0123456789abcdef"
STREAMS = "streams-token-0123456789abcdef"  # every stream; a bucket denied, a key prefix too


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rule(resource: str, *actions: str) -> dict:
    return {"resource": resource, "actions": list(actions)}


@pytest_asyncio.fixture
async def world(nats_server: EmbeddedServer, tmp_path: Path) -> AsyncIterator[tuple]:
    suffix = uuid.uuid4().hex[:10].upper()
    secret, users = f"SECRET{suffix}", f"USERS{suffix}"
    path = tmp_path / "auth.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {
                        "name": "admin",
                        "token": ADMIN,
                        "rules": [
                            rule("stream:*", "read", "write", "admin"),
                            rule("kv:*", "read", "write", "admin"),
                            rule("consumer:*/*", "consume", "admin"),
                        ],
                    },
                    {
                        "name": "streams",
                        "token": STREAMS,
                        "rules": [
                            rule("stream:*", "read", "write", "admin"),
                            rule(f"kv:{secret}"),
                            rule(f"kv:{users}", "read"),
                            rule(f"kv:{users}/hidden."),
                            rule("consumer:*/*", "consume"),
                        ],
                    },
                ]
            }
        )
    )
    async with running_gateway(gateway_settings(nats_server.url, auth_file=path)) as gw:
        for bucket in (secret, users):
            made = await gw.put(f"/v1/kv/{bucket}", json={}, headers=bearer(ADMIN))
            assert made.status_code == 201, made.text
        for bucket, key in ((secret, "plan"), (users, "open.a"), (users, "hidden.b")):
            put = await gw.put(f"/v1/kv/{bucket}/keys/{key}", content=b"v", headers=bearer(ADMIN))
            assert put.status_code == 200, put.text
        yield gw, secret, users


async def test_a_denied_bucket_stays_denied_through_its_stream(world: tuple) -> None:
    gw, secret, _ = world
    stream, auth = f"KV_{secret}", bearer(STREAMS)
    problem(await gw.get(f"/v1/kv/{secret}/keys/plan", headers=auth), 403)
    problem(await gw.get(f"/v1/streams/{stream}/messages/1", headers=auth), 403)
    problem(
        await gw.get(f"/v1/streams/{stream}/last/$KV.{secret}.plan", headers=auth),
        403,
    )
    last = {"last_by_subj": f"$KV.{secret}.plan"}
    problem(await gw.get(f"/v1/streams/{stream}/direct", params=last, headers=auth), 403)
    problem(await gw.post(f"/v1/streams/{stream}/purge", json={}, headers=auth), 403)
    problem(await gw.delete(f"/v1/streams/{stream}", headers=auth), 403)
    # Other streams are the token's as before.
    assert (await gw.get(f"/v1/kv/{secret}", headers=bearer(ADMIN))).status_code == 200


async def test_a_denied_key_prefix_stays_denied_through_its_stream(world: tuple) -> None:
    gw, _, users = world
    stream, auth = f"KV_{users}", bearer(STREAMS)
    opened = await gw.get(f"/v1/streams/{stream}/last/$KV.{users}.open.a", headers=auth)
    assert opened.status_code == 200, opened.text
    problem(await gw.get(f"/v1/streams/{stream}/last/$KV.{users}.hidden.b", headers=auth), 403)
    # A read of the whole stream by sequence could return any key: it needs all of them.
    problem(await gw.get(f"/v1/streams/{stream}/messages/1", headers=auth), 403)
    multi = await gw.post(
        f"/v1/streams/{stream}/direct/multi",
        json={"subjects": [f"$KV.{users}.>"]},
        headers=auth,
    )
    assert multi.status_code == 200, multi.text
    subjects = {m["subject"] for m in multi.json()["messages"]}
    assert subjects == {f"$KV.{users}.open.a"}, multi.text


async def test_a_consumer_on_a_denied_bucket_is_refused(world: tuple) -> None:
    gw, secret, users = world
    for bucket, filters in ((secret, None), (users, f"$KV.{users}.>")):
        config = {"filter_subject": filters} if filters else {}
        made = await gw.put(
            f"/v1/streams/KV_{bucket}/consumers/c", json=config, headers=bearer(ADMIN)
        )
        assert made.status_code == 201, made.text
        fetched = await gw.post(
            f"/v1/streams/KV_{bucket}/consumers/c/fetch",
            json={"max_messages": 1, "expires": 1},
            headers=bearer(STREAMS),
        )
        body = problem(fetched, 403)
        assert "kv:" in body["detail"], body


def test_kv_rules_decide_for_the_bucket_stream_alongside_stream_rules() -> None:
    def r(kind: str, name: str, prefix: str | None, *actions: str) -> Rule:
        return Rule(Pattern(kind, name, prefix), frozenset(actions))

    token = Principal(
        "t",
        (
            r("stream", "*", None, "read", "write", "admin"),
            r("kv", "SECRET", None),
            r("kv", "U*", "hidden."),
        ),
    )
    assert not token.allows("read", Resource("stream", "KV_SECRET", "$KV.SECRET.k"))
    assert not token.allows("admin", Resource("stream", "KV_SECRET"))
    assert token.allows("read", Resource("stream", "ORDERS", "orders.1"))
    assert token.allows("read", Resource("stream", "KV_USERS", "$KV.USERS.open"))
    assert not token.allows("read", Resource("stream", "KV_USERS", "$KV.USERS.hidden.x"))
    assert not token.allows_all("read", "stream", "KV_USERS")
    assert token.allows_all("read", "stream", "KV_OTHER")
    assert token.readable_prefixes("stream", "KV_USERS") == [""]
    denied = access.consume_denial(token, "KV_USERS", [])
    assert denied is not None and denied[1].origin == Pattern("kv", "U*", "hidden.")
    assert access.consume_denial(token, "KV_USERS", ["$KV.USERS.open.>"]) is None
    try:
        access.check_delivered(token, "KV_SECRET", "c", "$KV.SECRET.k")
    except GatewayError as exc:
        assert "kv:SECRET" in exc.detail
    else:
        raise AssertionError("a message of a denied bucket was delivered")
