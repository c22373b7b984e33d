"""Grants limited to part of a stream hold stream-wide (issue 29, items 3 to 5).

Against a real nats-server, with an auth file of narrow grants: a writer limited to a subject
prefix can neither learn nor affect anything outside it (stream-wide preconditions, what a 412
says, Nats-Msg-Id de-duplication); a consume grant never bypasses a deny of the token's stream
rules; listings, their totals and /v1/info show only what the token may see. The publish route
is lean: its tests run on the lean path and on FastAPI's route both.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
import pytest_asyncio
from nats.js.api import AckPolicy, ConsumerConfig

from app.consumers import service as consumer_service
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway

ADMIN = "admin-token-0123456789abcdef"
WRITER = "writer-token-0123456789abcdef"  # write on <s>.eu. only, no read
OTHER_WRITER = "other-writer-token-0123456789"  # write on <s>.us. only
READER_WRITER = "reader-writer-token-012345678"  # read on the stream, write on <s>.eu.; worker-*
READER = "reader-token-0123456789abcdefg"  # read on the stream but <s>.secret.; worker-*
CONSUMER_ONLY = "consumer-only-token-012345678"  # worker-* alone, no stream rule
NOBODY = "nobody-token-0123456789abcdefg"  # a KV prefix, no stream
SECRET_ID = "acme-merger-4711"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def policy(stream: str, low: str, bucket: str) -> dict:
    def token(name: str, secret: str, *rules: tuple[str, list[str]]) -> dict:
        return {
            "name": name,
            "token": secret,
            "rules": [{"resource": r, "actions": a} for r, a in rules],
        }

    return {
        "tokens": [
            token(
                "admin",
                ADMIN,
                ("stream:*", ["read", "write", "admin"]),
                ("kv:*", ["read", "write", "admin"]),
                ("consumer:*/*", ["consume", "admin"]),
            ),
            token("writer", WRITER, (f"stream:{stream}/{low}.eu.", ["write"])),
            token("other-writer", OTHER_WRITER, (f"stream:{stream}/{low}.us.", ["write"])),
            token(
                "reader-writer",
                READER_WRITER,
                (f"stream:{stream}", ["read"]),
                (f"stream:{stream}/{low}.eu.", ["read", "write"]),
                (f"consumer:{stream}/worker-*", ["consume"]),
            ),
            token(
                "reader",
                READER,
                (f"stream:{stream}", ["read"]),
                (f"stream:{stream}/{low}.secret.", []),
                (f"consumer:{stream}/worker-*", ["consume"]),
            ),
            token("consumer-only", CONSUMER_ONLY, (f"consumer:{stream}/worker-*", ["consume"])),
            token("nobody", NOBODY, (f"kv:{bucket}/pre.", ["read"])),
        ]
    }


@dataclass
class World:
    gw: httpx.AsyncClient
    stream: str
    low: str
    bucket: str
    url: str  # the nats-server's

    async def publish(
        self, token: str, subject: str, data: bytes = b"x", **headers: str
    ) -> httpx.Response:
        sent = {k.replace("_", "-"): v for k, v in headers.items()}
        return await self.gw.post(
            f"/v1/publish/{subject}", content=data, headers={**bearer(token), **sent}
        )

    async def state(self) -> dict:
        info = await self.gw.get(f"/v1/streams/{self.stream}", headers=bearer(ADMIN))
        assert info.status_code == 200, info.text
        return info.json()["state"]

    async def message(self, seq: int) -> dict:
        got = await self.gw.get(f"/v1/streams/{self.stream}/messages/{seq}", headers=bearer(ADMIN))
        assert got.status_code == 200, got.text
        return got.json()


@pytest_asyncio.fixture(params=[True, False], ids=["lean", "fastapi"])
async def world(
    request: pytest.FixtureRequest, nats_server: EmbeddedServer, tmp_path: Path
) -> AsyncIterator[World]:
    stream = f"G{uuid.uuid4().hex[:12]}"
    low, bucket = stream.lower(), f"B{stream}"
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(policy(stream, low, bucket)))
    settings = gateway_settings(nats_server.url, auth_file=path, lean_paths=request.param)
    async with running_gateway(settings) as gw:
        created = await gw.put(
            f"/v1/streams/{stream}", json={"subjects": [f"{low}.>"]}, headers=bearer(ADMIN)
        )
        assert created.status_code == 201, created.text
        world = World(gw, stream, low, bucket, nats_server.url)
        # The admin's message on another subject, with an id nobody else should learn.
        secret = await world.publish(ADMIN, f"{low}.secret.42", b"merger", Nats_Msg_Id=SECRET_ID)
        assert secret.status_code == 200, secret.text
        yield world


def assert_no_leak(response: httpx.Response, *secrets: str) -> None:
    for secret in (SECRET_ID, *secrets):
        assert secret not in response.text, response.text


# -- 3. subject-limited writers -------------------------------------------------------------


async def test_stream_wide_preconditions_need_read_of_the_whole_stream(world: World) -> None:
    w, low = world, world.low
    before = await w.state()
    for header, value in (
        ("Nats-Expected-Last-Msg-Id", "guess"),
        ("Nats-Expected-Last-Sequence", "1"),
    ):
        refused = await w.gw.post(
            f"/v1/publish/{low}.eu.z", content=b"z", headers={**bearer(WRITER), header: value}
        )
        body = problem(refused, 403, "auth.forbidden")
        assert header in body["detail"] and "whole stream" in body["detail"], body
        assert_no_leak(refused)
        batch = {"messages": [{"subject": f"{low}.eu.z", "headers": {header: value}}]}
        refused = await w.gw.post("/v1/publish", json=batch, headers=bearer(WRITER))
        body = problem(refused, 403, "auth.forbidden")
        assert body["detail"].startswith("messages[0]: ") and header in body["detail"]
    assert await w.state() == before  # nothing stored

    # The subject's own precondition stays allowed.
    ok = await w.publish(WRITER, f"{low}.eu.z", Nats_Expected_Last_Subject_Sequence="0")
    assert ok.status_code == 200, ok.text
    # A token that may read the whole stream may use the stream-wide ones, and JetStream's
    # answer is passed on.
    wrong = await w.publish(READER_WRITER, f"{low}.eu.z", Nats_Expected_Last_Sequence="1")
    body = problem(wrong, 412, "publish.wrong_last_sequence")
    assert body["nats"]["description"].startswith("wrong last sequence")


async def test_problems_never_carry_another_subjects_id_sequence_or_data(world: World) -> None:
    w, low = world, world.low
    for i in range(3):
        await w.publish(ADMIN, f"{low}.secret.{i}", b"secret-data")
    own = await w.publish(WRITER, f"{low}.eu.a")
    assert own.status_code == 200
    last = (await w.state())["last_seq"]
    # A wrong subject sequence: JetStream's answer names a sequence; the writer, which may not
    # read the whole stream, gets the problem without it.
    for path, payload in (("single", None), ("batch", True)):
        if payload is None:
            wrong = await w.publish(WRITER, f"{low}.eu.a", Nats_Expected_Last_Subject_Sequence="1")
            body = problem(wrong, 412, "publish.wrong_last_sequence")
        else:
            batch = {
                "messages": [
                    {
                        "subject": f"{low}.eu.a",
                        "headers": {"Nats-Expected-Last-Subject-Sequence": "1"},
                    }
                ]
            }
            answer = await w.gw.post("/v1/publish", json=batch, headers=bearer(WRITER))
            assert answer.status_code == 200, answer.text
            result = answer.json()["results"][0]
            assert result["ok"] is False
            body = result["error"]
            assert body["code"] == "publish.wrong_last_sequence"
            wrong = answer
        assert "description" not in body.get("nats", {}), (path, body)
        assert not any(ch.isdigit() for ch in body["detail"]), (path, body)
        assert_no_leak(wrong, "secret-data", base64.b64encode(b"secret-data").decode())
    assert (await w.state())["last_seq"] == last  # nothing stored


async def test_msg_ids_of_a_subject_limited_writer_never_meet_another_writers(
    world: World,
) -> None:
    w, low = world, world.low
    # Probing for an id stored elsewhere in the stream: not a duplicate, stored.
    probe = await w.publish(WRITER, f"{low}.eu.a", Nats_Msg_Id=SECRET_ID)
    assert probe.status_code == 200, probe.text
    assert probe.json()["duplicate"] is False
    seq = probe.json()["seq"]
    # The writer's own retry is still de-duplicated, on either publish route.
    again = await w.publish(WRITER, f"{low}.eu.a", Nats_Msg_Id=SECRET_ID)
    assert again.json() == {"stream": w.stream, "seq": seq, "duplicate": True}
    batch = {"messages": [{"subject": f"{low}.eu.b", "msg_id": SECRET_ID}]}
    answer = await w.gw.post("/v1/publish", json=batch, headers=bearer(WRITER))
    assert answer.json()["results"][0]["ack"] == {"stream": w.stream, "seq": seq, "duplicate": True}
    alias = await w.publish(WRITER, f"{low}.eu.a", Idempotency_Key=SECRET_ID)
    assert alias.json()["duplicate"] is True

    # An id the writer uses first does not make another writer's message vanish.
    first = await w.publish(WRITER, f"{low}.eu.c", Nats_Msg_Id="order-1")
    assert first.json()["duplicate"] is False
    for token, subject in ((ADMIN, f"{low}.secret.43"), (OTHER_WRITER, f"{low}.us.c")):
        later = await w.publish(token, subject, Nats_Msg_Id="order-1")
        assert later.status_code == 200, later.text
        assert later.json()["duplicate"] is False, (token, later.json())
    # A writer of the whole stream keeps ids as given: JetStream de-duplicates across its
    # messages as before.
    admin_again = await w.publish(ADMIN, f"{low}.secret.44", Nats_Msg_Id=SECRET_ID)
    assert admin_again.json()["duplicate"] is True

    # The stored id is the scoped one (as readers see it), the admin's is as given.
    stored = (await w.message(seq))["headers"]["Nats-Msg-Id"][0]
    assert stored.startswith("jsgw~") and stored.endswith(f"~{SECRET_ID}"), stored
    assert (await w.message(1))["headers"]["Nats-Msg-Id"] == [SECRET_ID]


async def test_a_scoped_writer_that_reads_the_whole_stream_compares_its_own_ids(
    world: World,
) -> None:
    w, low = world, world.low
    mine = await w.publish(READER_WRITER, f"{low}.eu.a", Nats_Msg_Id="m1")
    assert mine.status_code == 200
    # Its last id is its own "m1" (scoped alike); the admin's id is not one of its ids.
    ok = await w.publish(READER_WRITER, f"{low}.eu.b", Nats_Expected_Last_Msg_Id="m1")
    assert ok.status_code == 200, ok.text
    await w.publish(ADMIN, f"{low}.secret.1", Nats_Msg_Id="admin-2")
    wrong = await w.publish(READER_WRITER, f"{low}.eu.c", Nats_Expected_Last_Msg_Id="admin-2")
    problem(wrong, 412, "publish.wrong_last_msg_id")


# -- 4. consume never bypasses a deny --------------------------------------------------------


async def _consumer(w: World, name: str, **config: object) -> None:
    created = await w.gw.put(
        f"/v1/streams/{w.stream}/consumers/{name}",
        json={"ack_wait": "30s", **config},
        headers=bearer(ADMIN),
    )
    assert created.status_code in (200, 201), created.text


async def _fetch(w: World, token: str, consumer: str, n: int = 10) -> httpx.Response:
    return await w.gw.post(
        f"/v1/streams/{w.stream}/consumers/{consumer}/fetch",
        json={"max_messages": n, "expires": 1},
        headers=bearer(token),
    )


async def test_consume_is_refused_on_a_consumer_that_reaches_a_deny(world: World) -> None:
    w, low = world, world.low
    await w.publish(ADMIN, f"{low}.eu.1", b"eu-data")
    await _consumer(w, "worker-eu", filter_subject=f"{low}.eu.>")
    await _consumer(w, "worker-3", filter_subject=f"{low}.secret.>")
    await _consumer(w, "worker-all")
    # (Filters that do not overlap: nats-server 2.11 refuses overlapping ones.)
    await _consumer(w, "worker-multi", filter_subjects=[f"{low}.eu.1", f"{low}.*.42"])
    base = f"/v1/streams/{w.stream}/consumers"
    # An admin's ack token of a secret message, handed to the reader.
    fetched = await _fetch(w, ADMIN, "worker-3", 1)
    admin_ack = fetched.json()["messages"][0]["ack_token"]

    for consumer in ("worker-3", "worker-all", "worker-multi"):
        for refused in (
            await _fetch(w, READER, consumer),
            await w.gw.post(f"{base}/{consumer}/next", json={"expires": 1}, headers=bearer(READER)),
            await w.gw.get(f"{base}/{consumer}/consume", headers=bearer(READER)),
            await w.gw.post(
                f"{base}/{consumer}/ack",
                json={"acks": [{"token": admin_ack}]},
                headers=bearer(READER),
            ),
        ):
            body = problem(refused, 403, "auth.forbidden")
            assert f"stream:{w.stream}/{low}.secret." in body["detail"], body
            assert_no_leak(refused, "merger", base64.b64encode(b"merger").decode())

    # A consumer inside the grant serves the reader.
    ok = await _fetch(w, READER, "worker-eu")
    assert ok.status_code == 200, ok.text
    assert [m["subject"] for m in ok.json()["messages"]] == [f"{low}.eu.1"]
    acked = await w.gw.post(
        f"{base}/worker-eu/ack",
        json={"acks": [{"token": ok.json()["messages"][0]["ack_token"]}]},
        headers=bearer(READER),
    )
    assert acked.status_code == 200 and acked.json()["results"][0]["ok"], acked.text

    # Decided: consume stands on its own grant where no stream rule of the token applies.
    alone = await _fetch(w, CONSUMER_ONLY, "worker-3")
    assert alone.status_code == 200, alone.text


async def test_a_consumer_recreated_with_a_broader_filter_is_caught(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, low = world, world.low
    # The filter the gateway knows outlives the consumer: what it delivers is checked too.
    monkeypatch.setattr(consumer_service, "FILTERS_TTL", 60.0)
    await w.publish(ADMIN, f"{low}.eu.1", b"eu-data")
    await _consumer(w, "worker-1", filter_subject=f"{low}.eu.>")
    first = await _fetch(w, READER, "worker-1")  # the filter is now known
    assert [m["subject"] for m in first.json()["messages"]] == [f"{low}.eu.1"]
    # Re-created behind the gateway's back (by another replica, or on NATS directly).
    nc = await nats.connect(w.url)
    try:
        js = nc.jetstream()
        await js.delete_consumer(w.stream, "worker-1")
        await js.add_consumer(
            w.stream,
            ConsumerConfig(
                durable_name="worker-1",
                ack_policy=AckPolicy.EXPLICIT,
                filter_subject=f"{low}.>",
                ack_wait=30,
            ),
        )
    finally:
        await nc.close()
    refused = await _fetch(w, READER, "worker-1")
    body = problem(refused, 403, "auth.forbidden")
    assert "filter has changed" in body["detail"], body
    assert_no_leak(refused, "merger", base64.b64encode(b"merger").decode())
    # Then the filter is read again, and refused as such.
    body = problem(await _fetch(w, READER, "worker-1"), 403, "auth.forbidden")
    assert f"delivers '{low}.>'" in body["detail"], body
    # The refused pull gave its messages back: the admin gets them at once.
    again = await _fetch(w, ADMIN, "worker-1")
    assert f"{low}.secret.42" in [m["subject"] for m in again.json()["messages"]]

    # Updated through the gateway: the new filter is known at once.
    await _consumer(w, "worker-2", filter_subject=f"{low}.eu.>")
    assert (await _fetch(w, READER, "worker-2", 1)).status_code == 200
    await _consumer(w, "worker-2", filter_subject=f"{low}.>")
    body = problem(await _fetch(w, READER, "worker-2", 1), 403, "auth.forbidden")
    assert f"delivers '{low}.>'" in body["detail"], body


# -- 5. listings, counts and totals; /v1/info ------------------------------------------------


async def test_listings_and_info_show_only_what_the_token_may_see(world: World) -> None:
    w = world
    for bucket in (w.bucket, f"{w.bucket}X"):
        made = await w.gw.put(f"/v1/kv/{bucket}", json={}, headers=bearer(ADMIN))
        assert made.status_code in (200, 201), made.text
    await _consumer(w, "worker-1")
    await _consumer(w, "audit")

    nothing = (await w.gw.get("/v1/streams", headers=bearer(NOBODY))).json()
    assert nothing == {"streams": [], "total": 0, "offset": 0, "limit": 256}
    seen = (await w.gw.get("/v1/streams", headers=bearer(READER))).json()
    assert [s["name"] for s in seen["streams"]] == [w.stream] and seen["total"] == 1
    past = (await w.gw.get("/v1/streams?offset=1", headers=bearer(READER))).json()
    assert past["streams"] == [] and past["total"] == 1
    everything = (await w.gw.get("/v1/streams", headers=bearer(ADMIN))).json()
    assert everything["total"] >= 3  # the stream and the two buckets' streams at least

    listing = f"/v1/streams/{w.stream}/consumers"
    consumers = (await w.gw.get(listing, headers=bearer(READER_WRITER))).json()
    assert [c["name"] for c in consumers["consumers"]] == ["worker-1"]
    assert consumers["total"] == 1
    admin_view = (await w.gw.get(listing, headers=bearer(ADMIN))).json()
    assert admin_view["total"] == 2

    buckets = (await w.gw.get("/v1/kv", headers=bearer(NOBODY))).json()
    assert [b["bucket"] for b in buckets["buckets"]] == [w.bucket]
    assert (await w.gw.get("/v1/kv", headers=bearer(READER))).json()["buckets"] == []

    narrow = (await w.gw.get("/v1/info", headers=bearer(READER))).json()
    assert narrow["jetstream"] is None and narrow["pool"] is None
    assert narrow["version"] and narrow["server"]["max_payload"]
    whole = (await w.gw.get("/v1/info", headers=bearer(ADMIN))).json()
    assert whole["jetstream"]["streams"] >= 3 and whole["pool"]["connected"] >= 1
