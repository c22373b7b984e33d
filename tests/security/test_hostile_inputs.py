"""Bad-input suite (issue 6): hostile requests on every endpoint, against a real nats-server.

Every hostile request (tests/security/hostile_cases.py) must be answered with a 4xx
problem+json carrying X-Request-ID, never a 5xx; nothing may be written (the streams, buckets
and consumers are snapshotted through nats-py before and after); and no answer may contain
the value of another key or bucket. A subset runs with auth on: hostile input is a 400, 401 or
403, and a denial looks the same whether or not the resource exists.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, running_gateway
from tests.security import hostile_cases as hc
from tests.security.hostile_cases import NOTHING, Case
from tests.security.tally import Tally

pytestmark = pytest.mark.asyncio(loop_scope="module")

CASES = hc.all_cases()
MIN_CASES = 200
CASE_TIMEOUT = 10.0  # an accepted SSE request would never end: it fails at this timeout
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")

READER = "reader-token-0123456789abcdef"
AUTH_POLICY = {
    "tokens": [
        {
            "name": "reader",
            "token": READER,
            "rules": [
                {"resource": f"kv:{hc.BUCKET}", "actions": ["read"]},
                {"resource": f"kv:{hc.BUCKET}/{hc.DENIED_KEY}", "actions": []},
                {"resource": f"stream:{hc.STREAM}", "actions": ["read"]},
                {"resource": f"stream:{hc.STREAM}/host.secret.", "actions": []},
                {"resource": f"obj:{hc.OBJ_BUCKET}", "actions": ["read"]},
                {"resource": f"obj:{hc.OBJ_BUCKET}/private/", "actions": []},
            ],
        }
    ]
}


TALLY = Tally()


@dataclass
class World:
    url: str
    client: httpx.AsyncClient
    tokens: dict[str, str]  # real ack tokens, by consumer (and a tampered one)
    revision: int  # the current revision of BUCKET/KEY
    before: dict[str, Any]


# -- the fixture: a nats-server of this module, and the gateway on it ------------------------


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("hostile-store")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    yield server
    server.stop()


async def _ok(response: httpx.Response, *statuses: int) -> httpx.Response:
    assert response.status_code in (statuses or (200, 201, 204)), response.text
    return response


async def _populate(gw: httpx.AsyncClient) -> tuple[dict[str, str], int]:
    """The resources every case aims at, made through the gateway's API."""
    s, b = hc.STREAM, hc.BUCKET
    await _ok(await gw.put(f"/v1/streams/{s}", json={"subjects": ["host.>"], "allow_direct": True}))
    for i in range(3):
        await _ok(await gw.post(f"/v1/publish/host.a.{i}", content=f"host-{i}".encode()))
    await _ok(await gw.post(f"/v1/publish/{hc.DENIED_SUBJECT}", content=hc.STREAM_SECRET))
    for name in (hc.CONSUMER, hc.OTHER_CONSUMER):
        await _ok(await gw.put(f"/v1/streams/{s}/consumers/{name}", json={"ack_wait": "10m"}))
    grouped = {"priority_groups": [hc.GROUP], "priority_policy": "pinned_client", "ack_wait": "10m"}
    await _ok(await gw.put(f"/v1/streams/{s}/consumers/{hc.GROUPED}", json=grouped))
    tokens = {}
    for name in (hc.CONSUMER, hc.OTHER_CONSUMER):
        fetched = await _ok(
            await gw.post(
                f"/v1/streams/{s}/consumers/{name}/fetch", json={"max_messages": 1, "expires": 2}
            )
        )
        tokens[name] = fetched.json()["messages"][0]["ack_token"]
    token = tokens[hc.CONSUMER]
    tokens["tampered"] = token[:-2] + ("AA" if not token.endswith("AA") else "BB")

    for bucket in (b, hc.SECRET_BUCKET):
        await _ok(await gw.put(f"/v1/kv/{bucket}", json={"history": 5}))
    revision = (await _ok(await gw.put(f"/v1/kv/{b}/keys/{hc.KEY}", content=b"value-a"))).json()
    await _ok(await gw.put(f"/v1/kv/{b}/keys/b.c", content=b"value-b.c"))
    await _ok(await gw.put(f"/v1/kv/{b}/keys/{hc.DENIED_KEY}", content=hc.DENIED_VALUE))
    secret = f"/v1/kv/{hc.SECRET_BUCKET}/keys/{hc.SECRET_KEY}"
    await _ok(await gw.put(secret, content=hc.SECRET_VALUE))
    for bucket in (hc.OBJ_BUCKET, hc.OBJ_SECRET_BUCKET):
        await _ok(await gw.put(f"/v1/obj/{bucket}"), 201)
    await _ok(await gw.put(f"/v1/obj/{hc.OBJ_BUCKET}/objects/{hc.OBJ_NAME}", content=b"obj-o"), 201)
    denied = f"/v1/obj/{hc.OBJ_BUCKET}/objects/{hc.OBJ_DENIED}"
    await _ok(await gw.put(denied, content=hc.DENIED_VALUE), 201)
    secret_obj = f"/v1/obj/{hc.OBJ_SECRET_BUCKET}/objects/{hc.OBJ_NAME}"
    await _ok(await gw.put(secret_obj, content=hc.SECRET_VALUE), 201)
    return tokens, revision["revision"]


async def snapshot(nc: nats.NATS) -> dict[str, Any]:
    """Every stream (buckets included) with its config and state, and every consumer with its
    config, delivery and ack state, and priority group pins, as the server reports them."""

    async def api(subject: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=5)
        return json.loads(reply.data)

    streams: dict[str, Any] = {}
    listing = await api("$JS.API.STREAM.LIST", {"offset": 0})
    for info in listing.get("streams") or []:
        name = info["config"]["name"]
        state = {
            k: info["state"].get(k)
            for k in (
                "messages",
                "bytes",
                "first_seq",
                "last_seq",
                "num_deleted",
                "num_subjects",
                "consumer_count",
            )
        }
        consumers = {}
        for c in (await api(f"$JS.API.CONSUMER.LIST.{name}", {"offset": 0})).get("consumers") or []:
            consumers[c["name"]] = {
                "config": c["config"],
                "delivered": (c["delivered"]["consumer_seq"], c["delivered"]["stream_seq"]),
                "ack_floor": (c["ack_floor"]["consumer_seq"], c["ack_floor"]["stream_seq"]),
                "num_ack_pending": c["num_ack_pending"],
                "num_redelivered": c["num_redelivered"],
                "num_pending": c["num_pending"],
                "pins": [
                    (g.get("group"), g.get("pinned_client_id"))
                    for g in c.get("priority_groups") or []
                ],
            }
        streams[name] = {"config": info["config"], "state": state, "consumers": consumers}
    return streams


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(hostile_server: EmbeddedServer) -> AsyncIterator[World]:
    # A small multi-read cap, so that going over it is one request of the table.
    settings = gateway_settings(hostile_server.url, max_multi_subjects=1000)
    async with running_gateway(settings) as client:
        tokens, revision = await _populate(client)
        nc = await nats.connect(hostile_server.url)
        try:
            before = await snapshot(nc)
        finally:
            await nc.close()
        yield World(hostile_server.url, client, tokens, revision, before)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def auth_client(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    path = tmp_path_factory.mktemp("hostile-auth") / "auth.json"
    path.write_text(json.dumps(AUTH_POLICY))
    async with running_gateway(gateway_settings(world.url, auth_file=path)) as client:
        yield client


# -- sending and checking ------------------------------------------------------------------------


def _with_revision(value: str | bytes, revision: int) -> str | bytes:
    if isinstance(value, bytes):
        return value.replace(b"{rev}", str(revision).encode())
    return value.replace("{rev}", str(revision))


async def send(client: httpx.AsyncClient, case: Case, world: World) -> httpx.Response:
    kwargs: dict[str, Any] = {}
    if case.headers:
        kwargs["headers"] = [(n, _with_revision(v, world.revision)) for n, v in case.headers]
    if case.body is not NOTHING:
        kwargs["json"] = case.body(world.tokens) if callable(case.body) else case.body
    elif case.content is not None:
        kwargs["content"] = case.content
    request = client.request(case.method, case.path, **kwargs)
    try:
        return await asyncio.wait_for(request, CASE_TIMEOUT)
    except TimeoutError:
        what = "an event stream was opened" if case.sse else "no answer"
        pytest.fail(f"{case.id}: hostile input accepted ({what} within {CASE_TIMEOUT}s)")


def _secret_forms(secret: bytes) -> list[bytes]:
    return [secret, base64.b64encode(secret), base64.urlsafe_b64encode(secret).rstrip(b"=")]


def assert_no_secret(response: httpx.Response, what: str) -> None:
    headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items()).encode()
    for secret in hc.SECRETS:
        for form in _secret_forms(secret):
            assert form not in response.content, f"{what}: leaked {secret!r} in the body"
            assert form not in headers, f"{what}: leaked {secret!r} in the headers"


def assert_problem(response: httpx.Response, case: Case, allowed: frozenset[int] | None) -> dict:
    status = response.status_code
    shown = f"{case.id}: {status} {response.headers.get('content-type')} {response.text[:300]!r}"
    assert 400 <= status < 500, shown
    if allowed is not None:
        assert status in allowed, shown
    assert response.headers.get("content-type", "").startswith("application/problem+json"), shown
    request_id = response.headers.get("x-request-id")
    assert request_id and _SAFE_REQUEST_ID.fullmatch(request_id), shown
    assert_no_secret(response, case.id)
    if case.method == "HEAD":  # no body, but the same status and headers as GET
        return {}
    body = response.json()
    assert body["status"] == status, shown
    assert isinstance(body["code"], str) and body["code"], shown
    assert isinstance(body["detail"], str), shown
    assert body.get("instance") == request_id, shown
    return body


# -- the suite ------------------------------------------------------------------------------------


async def test_enough_hostile_cases() -> None:
    assert len(CASES) >= MIN_CASES, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_hostile_input(case: Case, world: World) -> None:
    response = await send(world.client, case, world)
    TALLY.executed += 1
    TALLY.statuses.setdefault(response.status_code, []).append(case.id)
    assert_problem(response, case, case.statuses)


# -- auth on: 400/401/403 only, and a 403 that does not tell whether the thing exists ---------

_READER = (("Authorization", f"Bearer {READER}"),)
_KEY_PATH = f"/v1/kv/{hc.BUCKET}/keys/{hc.KEY}"
_AUTH_HEADERS: list[tuple[str, list[tuple[str, str | bytes]]]] = [
    ("missing", []),
    ("scheme only", [("Authorization", "Bearer")]),
    ("empty token", [("Authorization", "Bearer ")]),
    ("basic", [("Authorization", "Basic cmVhZGVyOnB3")]),
    ("unknown token", [("Authorization", "Bearer not-a-known-token-000")]),
    ("token crlf", [("Authorization", f"Bearer {READER}\r\nX-Admin: 1".encode())]),
    ("token nul", [("Authorization", f"Bearer {READER}\x00".encode())]),
    ("token non-utf8", [("Authorization", b"Bearer \xff\xfe\xfd")]),
    ("token 20000", [("Authorization", "Bearer " + "t" * 20000)]),
    ("tab separator", [("Authorization", f"Bearer\t{READER}")]),
    ("other scheme", [("Authorization", f"Token {READER}")]),
    ("token twice in one", [("Authorization", f"Bearer {READER} {READER}")]),
    ("token prefix", [("Authorization", f"Bearer {READER[:-1]}")]),
    ("bare token", [("Authorization", READER)]),
    (
        "twice, valid first",
        [("Authorization", f"Bearer {READER}"), ("Authorization", "Bearer not-a-known-token-000")],
    ),
    (
        "twice, valid last",
        [("Authorization", "Bearer not-a-known-token-000"), ("Authorization", f"Bearer {READER}")],
    ),
]


def _auth_cases() -> list[Case]:
    cases = []
    for label, headers in _AUTH_HEADERS:
        for method, content in (("GET", None), ("PUT", b"hostile"), ("DELETE", None)):
            cases.append(
                Case(
                    f"{method} {_KEY_PATH} authorization={label}",
                    method,
                    _KEY_PATH,
                    headers=tuple(headers),
                    content=content,
                    statuses=frozenset({400, 401}),
                )
            )
    watch = f"/v1/kv/{hc.BUCKET}/watch"
    forged = base64.urlsafe_b64encode(b'{"n":"reader","e":9999999999}').rstrip(b"=").decode()
    for label, query in [
        ("garbage", "garbage"),
        ("two parts", "a.b"),
        ("5000", "x" * 5000),
        ("forged mac", f"{forged}.AAAA"),
        ("non-utf8", "%FF.%FE"),
    ]:
        cases.append(
            Case(
                f"GET {watch} access_token={label}",
                "GET",
                f"{watch}?access_token={query}",
                sse=True,
                statuses=frozenset({401}),
            )
        )
    cases.append(
        Case(
            f"GET {watch} cookie=garbage",
            "GET",
            watch,
            sse=True,
            headers=(("Cookie", "jsgw_sse=garbage.token"),),
            statuses=frozenset({401}),
        )
    )
    # Hostile input in what the reader may read is still a 400; writes are not allowed at all.
    for label, key in hc.KEY_VARIANTS:
        cases.append(
            Case(
                f"GET /v1/kv/PUB/keys/{{key}} reader key={label}",
                "GET",
                f"/v1/kv/{hc.BUCKET}/keys/{key}",
                headers=_READER,
                statuses=frozenset({400, 403}),
            )
        )
        cases.append(
            Case(
                f"PUT /v1/kv/PUB/keys/{{key}} reader key={label}",
                "PUT",
                f"/v1/kv/{hc.BUCKET}/keys/{key}",
                headers=_READER,
                content=b"x",
                statuses=frozenset({400, 403}),
            )
        )
    for label, subject in hc.SUBJECT_VARIANTS:
        cases.append(
            Case(
                f"POST /v1/publish/{{subject}} reader subject={label}",
                "POST",
                f"/v1/publish/{subject}",
                headers=_READER,
                content=b"x",
                statuses=frozenset({400, 403}),
            )
        )
    return cases


AUTH_CASES = _auth_cases()


@pytest.mark.parametrize("case", AUTH_CASES, ids=[c.id for c in AUTH_CASES])
async def test_hostile_input_with_auth(
    case: Case, world: World, auth_client: httpx.AsyncClient
) -> None:
    response = await send(auth_client, case, world)
    TALLY.auth_executed += 1
    assert_problem(response, case, case.statuses)
    if response.status_code == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")


# Denied requests in pairs: the resource exists / does not. Same 403, same problem.
_EXISTS = {
    "bucket": hc.SECRET_BUCKET,
    "stream": f"KV_{hc.SECRET_BUCKET}",
    "key": hc.DENIED_KEY,
    "subject": hc.DENIED_SUBJECT,
    "consumer": hc.CONSUMER,
    "seq": "4",
    "kv_subject": f"$KV.{hc.SECRET_BUCKET}.{hc.SECRET_KEY}",
    "object": hc.OBJ_DENIED,
    "obj_bucket": hc.OBJ_SECRET_BUCKET,
}
_MISSING = {
    "bucket": "NO_SUCH_BUCKET",
    "stream": "NO_SUCH_STREAM",
    "key": "pub.secret.none",
    "subject": "host.secret.none",
    "consumer": "NO_SUCH_CONSUMER",
    "seq": "99999",
    "kv_subject": "$KV.NO_SUCH_BUCKET.secret",
    "object": "private/none",
    "obj_bucket": "NO_SUCH_BUCKET",
}
_DENIED: list[tuple[str, str, Any]] = [
    # (method, path template over the names above, body)
    ("GET", "/v1/obj/{obj_bucket}", NOTHING),
    ("PUT", "/v1/obj/{obj_bucket}", {}),
    ("DELETE", "/v1/obj/{obj_bucket}", NOTHING),
    ("GET", "/v1/obj/{obj_bucket}/objects", NOTHING),
    ("GET", "/v1/obj/{obj_bucket}/objects/o", NOTHING),
    ("HEAD", "/v1/obj/{obj_bucket}/objects/o", NOTHING),
    ("PUT", "/v1/obj/{obj_bucket}/objects/o", b"x"),
    ("DELETE", "/v1/obj/{obj_bucket}/objects/o", NOTHING),
    ("GET", "/v1/obj/{obj_bucket}/watch", NOTHING),
    ("GET", f"/v1/obj/{hc.OBJ_BUCKET}/objects/{{object}}", NOTHING),
    ("GET", f"/v1/obj/{hc.OBJ_BUCKET}/info/{{object}}", NOTHING),
    ("PUT", f"/v1/obj/{hc.OBJ_BUCKET}/objects/{{object}}", b"x"),
    ("GET", "/v1/streams/OBJ_{obj_bucket}/messages/1", NOTHING),
    ("GET", "/v1/kv/{bucket}", NOTHING),
    ("PUT", "/v1/kv/{bucket}", {}),
    ("DELETE", "/v1/kv/{bucket}", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys?filter=%3E", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/secret", NOTHING),
    ("HEAD", "/v1/kv/{bucket}/keys/secret", NOTHING),
    ("PUT", "/v1/kv/{bucket}/keys/secret", b"x"),
    ("DELETE", "/v1/kv/{bucket}/keys/secret", NOTHING),
    ("GET", "/v1/kv/{bucket}/history/secret", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/%2A", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/%3E", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/secret%00", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/%2E%2E", NOTHING),
    ("GET", "/v1/kv/{bucket}/keys/secret%0D%0A", NOTHING),
    ("GET", "/v1/kv/{bucket}/watch", NOTHING),
    ("POST", "/v1/kv/{bucket}/read", {"keys": [">"]}),
    ("GET", "/v1/kv/{bucket}/mirrors", NOTHING),
    ("PUT", "/v1/kv/{bucket}/mirrors/M", {}),
    ("DELETE", "/v1/kv/{bucket}/mirrors/M", NOTHING),
    ("POST", "/v1/kv/{bucket}/origins", {"bucket": hc.SECRET_BUCKET}),
    ("PUT", f"/v1/kv/{hc.BUCKET}/mirrors/M", {}),
    ("POST", f"/v1/kv/{hc.BUCKET}/origins", {"bucket": hc.SECRET_BUCKET}),
    ("GET", f"/v1/kv/{hc.BUCKET}/keys/{{key}}", NOTHING),
    ("GET", f"/v1/kv/{hc.BUCKET}/history/{{key}}", NOTHING),
    ("PUT", f"/v1/kv/{hc.BUCKET}/keys/{{key}}", b"x"),
    ("GET", "/v1/streams/{stream}", NOTHING),
    ("PUT", "/v1/streams/{stream}", {"subjects": ["denied.>"]}),
    ("DELETE", "/v1/streams/{stream}", NOTHING),
    ("POST", "/v1/streams/{stream}/purge", {}),
    ("GET", "/v1/streams/{stream}/messages/1", NOTHING),
    ("GET", "/v1/streams/{stream}/direct?seq=1", NOTHING),
    ("GET", "/v1/streams/{stream}/last/host.a.0", NOTHING),
    ("POST", "/v1/streams/{stream}/direct/multi", {"subjects": [">"]}),
    ("GET", "/v1/streams/{stream}/consumers", NOTHING),
    ("GET", f"/v1/streams/{hc.STREAM}/last/{{subject}}", NOTHING),
    ("GET", f"/v1/streams/{hc.STREAM}/direct?last_by_subj={{subject}}", NOTHING),
    ("POST", "/v1/publish/{subject}", b"x"),
    ("POST", "/v1/publish/{kv_subject}", b"x"),
    ("POST", "/v1/publish", {"messages": [{"subject": "{kv_subject}"}]}),
    ("GET", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}", NOTHING),
    ("POST", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}/fetch", {"no_wait": True}),
    ("POST", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}/ack", {"acks": [{"token": "x"}]}),
    ("DELETE", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}", NOTHING),
    ("GET", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}/consume", NOTHING),
    # Reads by sequence need read on the whole stream, which a carve-out takes away.
    ("GET", f"/v1/streams/{hc.STREAM}/messages/{{seq}}", NOTHING),
    ("GET", f"/v1/streams/{hc.STREAM}/direct?seq={{seq}}", NOTHING),
    ("GET", f"/v1/streams/{hc.STREAM}/direct?seq={{seq}}&batch=10", NOTHING),
    ("GET", f"/v1/counters/{hc.STREAM}/{{subject}}", NOTHING),
    ("POST", f"/v1/counters/{hc.STREAM}/{{subject}}", {"increment": 1}),
    ("POST", "/v1/counters/{stream}/read", {"subjects": [">"]}),
    ("POST", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}/pause", {"until": "1s"}),
    ("POST", f"/v1/streams/{hc.STREAM}/consumers/{{consumer}}/resume", NOTHING),
]


def _denied_pair(method: str, template: str, body: Any) -> tuple[Case, Case]:
    def one(names: dict[str, str], tag: str) -> Case:
        path = template.format(**names)
        content = body if isinstance(body, bytes) else None
        json_body = body if not isinstance(body, bytes) else NOTHING
        if isinstance(json_body, dict) and "messages" in json_body:
            json_body = {"messages": [{"subject": names["kv_subject"]}]}
        return Case(
            f"{method} {template} {tag}",
            method,
            path,
            headers=_READER,
            body=json_body,
            content=content,
            sse=True,
            statuses=frozenset({403}),
        )

    return one(_EXISTS, "exists"), one(_MISSING, "missing")


DENIED_PAIRS = [_denied_pair(*spec) for spec in _DENIED]


@pytest.mark.parametrize("pair", DENIED_PAIRS, ids=[p[0].id[:-7] for p in DENIED_PAIRS])
async def test_denial_does_not_reveal_existence(
    pair: tuple[Case, Case], world: World, auth_client: httpx.AsyncClient
) -> None:
    exists, missing = pair
    answers = []
    for case in (exists, missing):
        response = await send(auth_client, case, world)
        TALLY.auth_executed += 1
        body = assert_problem(response, case, case.statuses)
        body.pop("instance", None)
        answers.append((response.status_code, body))
    assert answers[0] == answers[1], answers


_NARROWED: list[tuple[str, str, Any]] = [
    ("POST", f"/v1/kv/{hc.BUCKET}/read", {"keys": [">"]}),
    ("POST", f"/v1/kv/{hc.BUCKET}/read", {"keys": ["pub.*", "*", hc.DENIED_KEY]}),
    ("POST", f"/v1/kv/{hc.BUCKET}/read", {"keys": [">"], "include_deleted": True}),
    ("GET", f"/v1/kv/{hc.BUCKET}/keys?filter=%3E", NOTHING),
    ("GET", f"/v1/kv/{hc.BUCKET}/keys?filter=pub.%2A", NOTHING),
    ("POST", f"/v1/streams/{hc.STREAM}/direct/multi", {"subjects": [">"]}),
    ("POST", f"/v1/streams/{hc.STREAM}/direct/multi", {"subjects": ["host.secret.>", "host.*.*"]}),
    ("GET", "/v1/kv", NOTHING),
    ("GET", "/v1/streams", NOTHING),
    ("GET", "/v1/obj", NOTHING),
    ("GET", f"/v1/obj/{hc.OBJ_BUCKET}/objects", NOTHING),
    ("GET", f"/v1/obj/{hc.OBJ_BUCKET}/objects?include_deleted=true", NOTHING),
]


@pytest.mark.parametrize(
    "method,path,body",
    _NARROWED,
    ids=[f"{m} {p} {b if b is not NOTHING else ''}" for m, p, b in _NARROWED],
)
async def test_wildcard_reads_are_narrowed_never_widened(
    method: str, path: str, body: Any, auth_client: httpx.AsyncClient
) -> None:
    """Wildcard reads the reader may make: 200, without a denied key's or subject's data."""
    kwargs = {"json": body} if body is not NOTHING else {}
    response = await auth_client.request(method, path, headers=dict(_READER), **kwargs)
    TALLY.auth_executed += 1
    assert response.status_code == 200, response.text
    assert_no_secret(response, f"{method} {path}")
    assert hc.DENIED_KEY.encode() not in response.content
    assert hc.DENIED_SUBJECT.encode() not in response.content


# -- after everything: nothing was written -----------------------------------------------------


async def test_no_write_happened(world: World, request: pytest.FixtureRequest) -> None:
    """Runs last in this module: the streams, buckets and consumers are as they were."""
    nc = await nats.connect(world.url)
    try:
        after = await snapshot(nc)
    finally:
        await nc.close()
    assert sorted(after) == sorted(world.before), "streams or buckets were created or deleted"
    for name, before in world.before.items():
        assert after[name]["state"] == before["state"], f"stream {name} was written to"
        assert after[name]["config"] == before["config"], f"stream {name} was reconfigured"
        assert after[name]["consumers"] == before["consumers"], f"consumers of {name} changed"
    if not request.config.getoption("keyword") and not request.config.getoption("markexpr"):
        assert TALLY.executed >= MIN_CASES, TALLY.executed
