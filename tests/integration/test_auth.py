"""Authentication and per-resource authorization, end to end."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats
import pytest

from app.auth.guard import Authenticator
from app.errors import Unauthorized
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway

ADMIN = "admin-token-0123456789"
APP = "app-token-0123456789ab"
POLICY = """
tokens:
  - name: admin
    token: "{admin}"
    rules:
      - {{resource: "stream:*", actions: [read, write, admin]}}
      - {{resource: "kv:*", actions: [read, write, admin]}}
  - name: app
    token: "{app}"
    rules:
      - {{resource: "stream:{s}/{lower}.eu.", actions: [read, write]}}
      - {{resource: "stream:{s}/{lower}.eu.secret", actions: []}}
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def auth_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "auth.yaml"
    path.write_text(POLICY.format(admin=ADMIN, app=APP, s=name, lower=name.lower()))
    return path


@pytest.mark.server("2.11")
async def test_tokens_and_grants(nats_server: EmbeddedServer, auth_file: Path, name: str) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    low = name.lower()
    async with running_gateway(settings) as gw:
        # Probes stay open; everything else needs a token.
        assert (await gw.get("/healthz")).status_code == 200
        assert (await gw.get("/readyz")).status_code == 200
        body = problem(await gw.get("/v1/streams"), 401, "auth.required")
        assert "Bearer" in body["detail"]
        unauth = await gw.get(f"/v1/streams/{name}")
        assert unauth.headers["www-authenticate"].startswith("Bearer")
        problem(await gw.get("/v1/streams", headers=bearer("wrong-token-000000000")), 401)
        problem(await gw.get("/v1/streams", headers={"Authorization": "Basic eDp5"}), 401)

        created = await gw.put(
            f"/v1/streams/{name}",
            json={"subjects": [f"{low}.>"], "allow_direct": True},
            headers=bearer(ADMIN),
        )
        assert created.status_code == 201
        # The app token may write and read orders.eu.*, nothing else, and is no admin.
        problem(
            await gw.put(
                f"/v1/streams/{name}", json={"subjects": [f"{low}.>"]}, headers=bearer(APP)
            ),
            403,
            "auth.forbidden",
        )
        ok = await gw.post(f"/v1/publish/{low}.eu.1", content=b"eu", headers=bearer(APP))
        assert ok.status_code == 200, ok.text
        problem(await gw.post(f"/v1/publish/{low}.us.1", content=b"us", headers=bearer(APP)), 403)
        problem(
            await gw.post(f"/v1/publish/{low}.eu.secret", content=b"s", headers=bearer(APP)), 403
        )
        batch = {"messages": [{"subject": f"{low}.eu.2"}, {"subject": f"{low}.us.2"}]}
        problem(await gw.post("/v1/publish", json=batch, headers=bearer(APP)), 403)
        await gw.post(f"/v1/publish/{low}.us.1", content=b"us", headers=bearer(ADMIN))
        await gw.post(f"/v1/publish/{low}.eu.secret", content=b"s", headers=bearer(ADMIN))

        got = await gw.get(f"/v1/streams/{name}/last/{low}.eu.1", headers=bearer(APP))
        assert got.content == b"eu"
        problem(await gw.get(f"/v1/streams/{name}/last/{low}.us.1", headers=bearer(APP)), 403)
        # Denied the same way whether or not the thing exists.
        a = problem(
            await gw.get(f"/v1/streams/{name}/last/{low}.us.nothing", headers=bearer(APP)), 403
        )
        b = problem(await gw.get("/v1/streams/NO_SUCH/last/x", headers=bearer(APP)), 403)
        assert a["detail"] == b["detail"]
        # Seq reads need the whole stream.
        problem(
            await gw.get(f"/v1/streams/{name}/direct", params={"seq": 1}, headers=bearer(APP)), 403
        )

        multi = await gw.post(
            f"/v1/streams/{name}/direct/multi", json={"subjects": [f"{low}.>"]}, headers=bearer(APP)
        )
        assert multi.status_code == 200
        assert [m["subject"] for m in multi.json()["messages"]] == [f"{low}.eu.1"]
        every = await gw.post(
            f"/v1/streams/{name}/direct/multi",
            json={"subjects": [f"{low}.>"]},
            headers=bearer(ADMIN),
        )
        assert len(every.json()["messages"]) == 3

        listed = (await gw.get("/v1/streams", headers=bearer(APP))).json()
        assert [s["name"] for s in listed["streams"]] == [name]


async def test_auth_file_reload_on_change(
    nats_server: EmbeddedServer, auth_file: Path, name: str
) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    async with running_gateway(settings) as gw:
        assert (await gw.get("/v1/info", headers=bearer(APP))).status_code == 200
        auth_file.write_text(auth_file.read_text().replace(APP, "rotated-token-0123456789"))
        os.utime(auth_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        await asyncio.sleep(1.1)
        problem(await gw.get("/v1/info", headers=bearer(APP)), 401)
        assert (
            await gw.get("/v1/info", headers=bearer("rotated-token-0123456789"))
        ).status_code == 200
        # A broken file keeps the tokens in force.
        auth_file.write_text("{broken")
        os.utime(auth_file, ns=(time.time_ns() + 3 * 10**9, time.time_ns() + 3 * 10**9))
        await asyncio.sleep(1.1)
        assert (
            await gw.get("/v1/info", headers=bearer("rotated-token-0123456789"))
        ).status_code == 200


async def test_sse_token(nats_server: EmbeddedServer, auth_file: Path) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file, sse_token_ttl=1)
    async with running_gateway(settings) as gw:
        minted = await gw.post("/v1/auth/sse-token", headers=bearer(APP))
        assert minted.status_code == 200
        token = minted.json()["token"]
        assert "jsgw_sse" in minted.headers["set-cookie"]
        assert "HttpOnly" in minted.headers["set-cookie"]
        assert "secure" not in minted.headers["set-cookie"].lower()  # plain HTTP here
        # Not a bearer token, and not accepted outside SSE routes.
        problem(await gw.get("/v1/info", headers=bearer(token)), 401)
        problem(await gw.get("/v1/info", params={"access_token": token}), 401)
    # Another gateway with another secret does not accept it; an expired one is refused.
    other = Authenticator(auth_file, b"other-secret")
    with pytest.raises(Unauthorized, match="invalid"):
        other.authenticate(None, token)
    same = Authenticator(auth_file, b"shared-secret")
    fresh, _ = same.mint_sse_token(same.policy.authenticate(APP), ttl=0.2)
    assert same.authenticate(None, fresh).name == "app"
    await asyncio.sleep(0.3)
    with pytest.raises(Unauthorized, match="expired"):
        same.authenticate(None, fresh)
    with pytest.raises(Unauthorized, match="malformed"):
        same.authenticate(None, "no-dot-here")


async def test_rate_limit(nats_server: EmbeddedServer, auth_file: Path) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file, rate_limit=2, rate_burst=3)
    async with running_gateway(settings) as gw:
        statuses = [(await gw.get("/v1/info", headers=bearer(APP))).status_code for _ in range(5)]
        assert statuses[:3] == [200, 200, 200]
        assert 429 in statuses[3:]
        limited = await gw.get("/v1/info", headers=bearer(APP))
        body = problem(limited, 429, "rate_limited")
        assert int(limited.headers["retry-after"]) >= 1
        assert body["detail"]
        # Another token has its own bucket.
        assert (await gw.get("/v1/info", headers=bearer(ADMIN))).status_code == 200


def test_public_bind_without_auth_is_refused() -> None:
    from pydantic import ValidationError

    from app.config import Settings

    with pytest.raises(ValidationError, match="JSGW_AUTH_FILE"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", allow_unauthenticated=True).host == "0.0.0.0"


async def test_nats_untouched_by_denied_requests(
    nats_server: EmbeddedServer, auth_file: Path, name: str
) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    async with running_gateway(settings) as gw:
        problem(
            await gw.put(
                f"/v1/streams/{name}", json={"subjects": [f"{name}.>"]}, headers=bearer(APP)
            ),
            403,
        )
    nc = await nats.connect(nats_server.url)
    try:
        with pytest.raises(nats.js.errors.NotFoundError):
            await nc.jetstream().stream_info(name)
    finally:
        await nc.close()


async def test_a_bucket_made_through_the_gateway_is_writable_at_once(
    nats_server: EmbeddedServer, tmp_path: Path, name: str
) -> None:
    """Which stream captures a subject is cached a few seconds for publish authorization;
    creating a bucket (or stream) through the gateway drops that cache at once."""
    writer = "kv-writer-token-0123456"
    path = tmp_path / "auth.yaml"
    path.write_text(
        POLICY.format(admin=ADMIN, app=APP, s=name, lower=name.lower())
        + f'  - name: writer\n    token: "{writer}"\n    rules:\n'
        f'      - {{resource: "stream:KV_{name}", actions: [write]}}\n'
    )
    async with running_gateway(gateway_settings(nats_server.url, auth_file=path)) as gw:
        subject = f"$KV.{name}.k"
        # No stream captures the subject yet: refused (and that answer is now cached).
        problem(await gw.post(f"/v1/publish/{subject}", content=b"1", headers=bearer(writer)), 403)
        made = await gw.put(f"/v1/kv/{name}", json={}, headers=bearer(ADMIN))
        assert made.status_code == 201, made.text
        ok = await gw.post(f"/v1/publish/{subject}", content=b"2", headers=bearer(writer))
        assert ok.status_code == 200, ok.text
        assert ok.json()["stream"] == f"KV_{name}"


@pytest.mark.server("2.12")
async def test_counter_grants(nats_server: EmbeddedServer, auth_file: Path, name: str) -> None:
    """Increments need write on the counter's subject, reads read on it; a multi read holds
    only the counters the token may read."""
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    low = name.lower()
    base = f"/v1/counters/{name}"
    async with running_gateway(settings) as gw:
        config = {"subjects": [f"{low}.>"], "allow_direct": True, "allow_msg_counter": True}
        created = await gw.put(f"/v1/streams/{name}", json=config, headers=bearer(ADMIN))
        assert created.status_code == 201, created.text
        one = {"increment": 1}
        ok = await gw.post(f"{base}/{low}.eu.hits", json=one, headers=bearer(APP))
        assert ok.json()["value"] == "1", ok.text
        for subject in (f"{low}.us.hits", f"{low}.eu.secret"):
            problem(await gw.post(f"{base}/{subject}", json=one, headers=bearer(APP)), 403)
            assert (await gw.post(f"{base}/{subject}", json=one, headers=bearer(ADMIN))).is_success
            problem(await gw.get(f"{base}/{subject}", headers=bearer(APP)), 403)
        assert (await gw.get(f"{base}/{low}.eu.hits", headers=bearer(APP))).json()["value"] == "1"

        read = {"subjects": [f"{low}.>"]}
        narrowed = await gw.post(f"{base}/read", json=read, headers=bearer(APP))
        assert [c["subject"] for c in narrowed.json()["counters"]] == [f"{low}.eu.hits"]
        every = await gw.post(f"{base}/read", json=read, headers=bearer(ADMIN))
        assert len(every.json()["counters"]) == 3


@pytest.mark.server("2.12")
async def test_a_counter_read_is_narrowed_before_values_are_made(
    nats_server: EmbeddedServer, auth_file: Path, name: str
) -> None:
    """A multi read makes nothing of the messages outside the token's grant: a message there
    that is no counter's value fails only the reads that may see it."""
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    low = name.lower()
    async with running_gateway(settings) as gw:
        # (a stream that does not count: a plain message is the broken value here)
        config = {"subjects": [f"{low}.>"], "allow_direct": True}
        created = await gw.put(f"/v1/streams/{name}", json=config, headers=bearer(ADMIN))
        assert created.status_code == 201, created.text
        for subject, data in ((f"{low}.eu.hits", b'{"val":"5"}'), (f"{low}.us.x", b"plain")):
            sent = await gw.post(f"/v1/publish/{subject}", content=data, headers=bearer(ADMIN))
            assert sent.status_code == 200, sent.text
        read = {"subjects": [">"]}
        narrowed = await gw.post(f"/v1/counters/{name}/read", json=read, headers=bearer(APP))
        assert narrowed.status_code == 200, narrowed.text
        assert narrowed.json()["counters"] == [
            {"subject": f"{low}.eu.hits", "seq": 1, "value": "5"}
        ]
        problem(
            await gw.post(f"/v1/counters/{name}/read", json=read, headers=bearer(ADMIN)),
            409,
            "counter.not_allowed",
        )


async def test_range_reads_need_read_on_every_subject_their_filter_reaches(
    nats_server: EmbeddedServer, auth_file: Path, name: str
) -> None:
    settings = gateway_settings(nats_server.url, auth_file=auth_file)
    low = name.lower()
    base = f"/v1/streams/{name}/messages"
    async with running_gateway(settings) as gw:
        created = await gw.put(
            f"/v1/streams/{name}", json={"subjects": [f"{low}.>"]}, headers=bearer(ADMIN)
        )
        assert created.status_code == 201, created.text
        for subject in (f"{low}.eu.1", f"{low}.eu.secret", f"{low}.us.1", f"{low}.eu.1"):
            stored = await gw.post(f"/v1/publish/{subject}", content=b"x", headers=bearer(ADMIN))
            assert stored.is_success, stored.text
        # The whole stream, or filters reaching the denied subject or past the grant: refused.
        for subject in (None, f"{low}.eu.>", f"{low}.eu.*", f"{low}.us.1", ">"):
            params = {"subject": subject} if subject else {}
            problem(await gw.get(base, params=params, headers=bearer(APP)), 403, "auth.forbidden")
        mine = await gw.get(base, params={"subject": f"{low}.eu.1"}, headers=bearer(APP))
        assert mine.status_code == 200, mine.text
        assert [line.count(b'"seq"') for line in mine.content.splitlines()] == [1, 1, 0]
        every = await gw.get(base, headers=bearer(ADMIN))
        assert len(every.content.splitlines()) == 5
