"""The lean paths answer exactly as the FastAPI routes do.

Each pair below sends the same request to the gateway (lean paths on) and to a gateway of the
same NATS server with them off (``via_fastapi``: FastAPI's routes), and compares the answers.
The gateway with lean paths runs both ways they are served: in-process through the ASGI app
(``asgi``: inside the middleware, as with CORS on) and on a real socket (``direct``: from the
HTTP protocol, app.fastpath.DirectPaths)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import nats.js.errors
import pytest

from app import fastpath
from app.config import Settings
from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, running_gateway, served_gateway
from tests.integration.test_kv_interop import stored_operations


@asynccontextmanager
async def lean_gateway(settings: Settings, how: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway served ``how``: ``asgi`` in-process, ``direct`` on a socket."""
    if how == "asgi":
        async with running_gateway(settings) as client:
            yield client
    else:
        with served_gateway(settings) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                yield client


@pytest.fixture(params=["asgi", "direct"])
def how(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def gateway(nats_server: EmbeddedServer, how: str) -> AsyncIterator[httpx.AsyncClient]:
    async with lean_gateway(gateway_settings(nats_server.url), how) as client:
        yield client


@pytest.fixture
async def via_fastapi(nats_server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway with the lean paths off, on the same NATS server."""
    async with running_gateway(gateway_settings(nats_server.url, lean_paths=False)) as client:
        yield client


@pytest.fixture
def lean_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The requests the lean paths answered (so a pair is never FastAPI twice)."""
    calls: list[str] = []
    original = fastpath.LeanPaths._respond

    async def spy(scope, receive):  # type: ignore[no-untyped-def]
        calls.append(scope["method"])  # (from the served gateway's thread too)
        return await original(scope, receive)

    monkeypatch.setattr(fastpath.LeanPaths, "_respond", staticmethod(spy))
    return calls


SAME_HEADERS = (
    "content-type",
    "content-length",
    "etag",
    "kv-revision",
    "kv-operation",
    "kv-created",
    "www-authenticate",
)


def same(fast: httpx.Response, slow: httpx.Response) -> None:
    assert fast.status_code == slow.status_code, (fast.text, slow.text)
    for name in SAME_HEADERS:
        assert fast.headers.get(name) == slow.headers.get(name), name
    if fast.headers.get("content-type", "").startswith("application/problem+json"):
        a, b = fast.json(), slow.json()
        assert a.pop("instance") == fast.headers["x-request-id"]
        b.pop("instance")
        assert a == b
    else:
        assert fast.content == slow.content


async def test_both_paths_answer_alike(
    gateway: httpx.AsyncClient, via_fastapi: httpx.AsyncClient, name: str, lean_calls: list[str]
) -> None:
    assert (await gateway.put(f"/v1/kv/{name}", json={"history": 3})).status_code == 201
    await gateway.put(f"/v1/kv/{name}/keys/a.b", content=b"\x00value")
    await gateway.put(f"/v1/kv/{name}/keys/gone", content=b"x")
    await gateway.delete(f"/v1/kv/{name}/keys/gone")
    cases = [
        (f"/v1/kv/{name}/keys/a.b", {}),
        (f"/v1/kv/{name}/keys/a.b", {"Accept": "application/json"}),
        (f"/v1/kv/{name}/keys/a.b", {"If-None-Match": '"1"'}),
        (f"/v1/kv/{name}/keys/a.b", {"If-None-Match": '"7"'}),
        (f"/v1/kv/{name}/keys/a.b", [("If-None-Match", '"7"'), ("If-None-Match", '"1"')]),
        (f"/v1/kv/{name}/keys/a.b", [("If-None-Match", '"1"'), ("If-None-Match", '"7"')]),
        (f"/v1/kv/{name}/keys/a.b", [("Accept", "text/plain"), ("Accept", "application/json")]),
        (f"/v1/kv/{name}/keys/a.b", [("Accept", "application/json"), ("Accept", "text/plain")]),
        (f"/v1/kv/{name}/keys/a.b", {"Accept": "text/plain, application/json;q=0.5"}),
        (f"/v1/kv/{name}/keys/gone", {}),
        (f"/v1/kv/{name}/keys/never", {}),
        (f"/v1/kv/{name}/keys/a.*", {}),
        (f"/v1/kv/{name}/keys/a%0Ab", {}),
        (f"/v1/kv/{name}/keys/.a", {}),
        ("/v1/kv/NO_SUCH_BUCKET/keys/a", {}),
        ("/v1/kv/bad.bucket/keys/a", {}),
        # Queries, validated by the route's own parameters either way.
        (f"/v1/kv/{name}/keys/a.b?revision=1", {}),
        (f"/v1/kv/{name}/keys/a.b?revision=1&revision=99", {}),
        (f"/v1/kv/{name}/keys/a.b?revision=0", {}),
        (f"/v1/kv/{name}/keys/a.b?revision=%2B1", {}),
        (f"/v1/kv/{name}/keys/a.b?revision=1&consistency=nearest", {}),
        (f"/v1/kv/{name}/keys/a.b?consistency=leader&ignored=1", {}),
        (f"/v1/kv/{name}/keys/gone?revision={2**64}", {}),
    ]
    for path, headers in cases:
        fast = await gateway.get(path, headers=headers)
        slow = await via_fastapi.get(path, headers=headers)
        same(fast, slow)
        fast = await gateway.head(path, headers=headers)
        slow = await via_fastapi.head(path, headers=headers)
        assert fast.status_code == slow.status_code, path
        assert fast.content == slow.content == b""
        for header in SAME_HEADERS:
            assert fast.headers.get(header) == slow.headers.get(header), (path, header)
    assert lean_calls.count("GET") == len(cases) and "PUT" in lean_calls
    assert lean_calls.count("HEAD") == len(cases)
    metrics = (await gateway.get("/metrics")).text
    line = 'jsgw_http_requests_total{method="GET",route="/v1/kv/{bucket}/keys/{key}",status="200"}'
    assert line in metrics


async def test_both_paths_refuse_a_watch_alike(
    gateway: httpx.AsyncClient, via_fastapi: httpx.AsyncClient, name: str, lean_calls: list[str]
) -> None:
    """A watch's refusals (its streams are compared by tests/integration/test_kv_watch.py,
    which runs both ways)."""
    assert (await gateway.put(f"/v1/kv/{name}", json={})).status_code == 201
    watch = f"/v1/kv/{name}/watch"
    cases = [
        (f"/v1/kv/{name}X/watch", {}),
        ("/v1/kv/a.b/watch", {}),
        (f"{watch}?key=a.>.b", {}),
        (f"{watch}?history=true&updates_only=1", {}),
        (f"{watch}?history=maybe", {}),
        (f"{watch}?since=-1&meta_only=2", {}),
        (f"{watch}?since=1.5", {}),
        (f"{watch}?since={2**64}", {}),
        (f"{watch}?since={2**64 - 1}", {}),
        (watch, {"Last-Event-ID": "abc"}),
        (f"{watch}?since=3", {"Last-Event-ID": "x"}),
    ]
    for path, headers in cases:
        fast = await gateway.get(path, headers=headers)
        slow = await via_fastapi.get(path, headers=headers)
        assert fast.status_code in (400, 404), fast.text
        same(fast, slow)
    assert lean_calls.count("GET") == len(cases)


async def test_both_paths_authorize_alike(
    nats_server: EmbeddedServer, tmp_path: Path, name: str, how: str
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        "  - {name: admin, token: admin-token-0123456789,"
        " rules: [{resource: 'kv:*', actions: [read, write, admin]}]}\n"
        "  - {name: app, token: app-token-0123456789ab,"
        f" rules: [{{resource: 'kv:{name}/pub.', actions: [read]}}]}}\n"
    )
    async with (
        lean_gateway(gateway_settings(nats_server.url, auth_file=auth), how) as gw,
        running_gateway(
            gateway_settings(nats_server.url, auth_file=auth, lean_paths=False)
        ) as via_fastapi,
    ):
        admin = {"Authorization": "Bearer admin-token-0123456789"}
        app = {"Authorization": "Bearer app-token-0123456789ab"}
        assert (await gw.put(f"/v1/kv/{name}", json={}, headers=admin)).status_code == 201
        await gw.put(f"/v1/kv/{name}/keys/pub.x", content=b"1", headers=admin)
        await gw.put(f"/v1/kv/{name}/keys/secret", content=b"2", headers=admin)
        for path, headers, status in [
            (f"/v1/kv/{name}/keys/pub.x", app, 200),
            (f"/v1/kv/{name}/keys/secret", app, 403),
            (f"/v1/kv/{name}/keys/pub.x", {}, 401),
            (f"/v1/kv/{name}/keys/pub.x", {"Authorization": "Bearer nope-nope-nope-nope"}, 401),
        ]:
            fast = await gw.get(path, headers=headers)
            slow = await via_fastapi.get(path, headers=headers)
            assert fast.status_code == status
            same(fast, slow)


def alike(fast: httpx.Response, slow: httpx.Response, *, differ: tuple[str, ...] = ()) -> None:
    """Two writes (to twin keys or subjects) answered alike: status, headers, body fields,
    except the fields that name what was written (``differ``: revision, seq, ...)."""
    assert fast.status_code == slow.status_code, (fast.text, slow.text)
    assert fast.headers.get("content-type") == slow.headers.get("content-type")
    # (connection: in-process, a body the app did not read is never received whole, and the
    # answer closes; on a socket a small body has come whole before the answer.
    # test_an_answer_before_the_whole_body_closes covers the direct path's.)
    skip = {"x-request-id", "etag", "kv-revision", "location", "content-length", "date"}
    skip.add("connection")
    assert {h for h in fast.headers if h not in skip} == {h for h in slow.headers if h not in skip}
    assert ("location" in fast.headers) == ("location" in slow.headers)
    assert ("kv-revision" in fast.headers) == ("kv-revision" in slow.headers)
    if fast.status_code == 204:
        assert fast.content == slow.content == b""
        return
    a, b = fast.json(), slow.json()
    for field in ("instance", *differ):
        a.pop(field, None)
        b.pop(field, None)
    if "detail" in a:  # problems name the key or subject
        a.pop("detail"), b.pop("detail")
    assert a == b


async def test_both_paths_write_alike(
    gateway: httpx.AsyncClient, via_fastapi: httpx.AsyncClient, nc, name: str, lean_calls: list[str]
) -> None:
    # (A bound the conditional deletes' headers fit in: the server counts them.)
    assert (await gateway.put(f"/v1/kv/{name}", json={"max_value_size": 128})).status_code == 201
    cases: list[tuple[dict[str, str], bytes]] = [
        ({}, b"v"),  # put: 200
        ({"If-None-Match": "*"}, b"v"),  # create over a value: 412 kv.key_exists
        ({"If-Match": '"999"'}, b"v"),  # no such revision: 504 outcome unknown
        ({}, b"x" * 129),  # over max_value_size: 413
    ]
    for headers, body in cases:
        fast = await gateway.put(f"/v1/kv/{name}/keys/fast", content=body, headers=headers)
        slow = await via_fastapi.put(f"/v1/kv/{name}/keys/slow", content=body, headers=headers)
        alike(fast, slow, differ=("revision",))
    created = [
        await client.put(
            f"/v1/kv/{name}/keys/new.{way}", content=b"v", headers={"If-None-Match": "*"}
        )
        for way, client in (("fast", gateway), ("slow", via_fastapi))
    ]
    alike(*created, differ=("revision",))
    assert created[0].status_code == 201
    assert created[0].headers["location"] == f"/v1/kv/{name}/keys/new.fast"
    for path in (f"/v1/kv/{name}/keys/a.*", "/v1/kv/NO_SUCH_BUCKET/keys/a", "/v1/kv/b.b/keys/a"):
        fast = await gateway.put(path, content=b"v")
        slow = await via_fastapi.put(path, content=b"v")
        same(fast, slow)
    deletes: list[tuple[str, dict[str, str]]] = [
        ("", {"If-Match": '"1"'}),  # not the key's revision: 412
        ("", {}),  # a DEL marker: 204
        ("?purge=true&ttl=1m", {}),  # the bucket takes no per-key TTL
        ("?ttl=1m", {}),  # ttl without purge: 400
        ("?purge=maybe", {}),  # 400 request.invalid
        ("?purge=true", {}),  # a PURGE marker: 204
    ]
    for query, headers in deletes:
        fast = await gateway.delete(f"/v1/kv/{name}/keys/new.fast{query}", headers=headers)
        slow = await via_fastapi.delete(f"/v1/kv/{name}/keys/new.slow{query}", headers=headers)
        alike(fast, slow, differ=("revision",))
    for path in (f"/v1/kv/{name}/keys/a.*", "/v1/kv/NO_SUCH_BUCKET/keys/a", "/v1/kv/b.b/keys/a"):
        same(await gateway.delete(path), await via_fastapi.delete(path))
    assert lean_calls.count("DELETE") == len(deletes) + 3
    # Every fast write is stored, and only those.
    kv = await nc.jetstream().key_value(name)
    assert (await kv.get("fast")).value == b"v"
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("new.fast")
    assert await stored_operations(nc, name, "new.fast") == ["PURGE"]

    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    for headers in (
        {},
        {"Nats-Msg-Id": "one"},
        {"Nats-Msg-Id": "one"},
        {"Nats-Expected-Last-Sequence": "999"},
        {"Nats-Expected-Last-Sequence": "x"},
    ):
        fast = await gateway.post(
            f"/v1/publish/{name}.fast",
            content=b"m",
            headers={k: f"{v}-fast" if k == "Nats-Msg-Id" else v for k, v in headers.items()},
        )
        slow = await via_fastapi.post(
            f"/v1/publish/{name}.slow",
            content=b"m",
            headers={k: f"{v}-slow" if k == "Nats-Msg-Id" else v for k, v in headers.items()},
        )
        alike(fast, slow, differ=("seq",))
    for subject in ("nowhere.x", f"{name}.*", f"{name}..x"):
        fast = await gateway.post(f"/v1/publish/{subject}", content=b"m")
        slow = await via_fastapi.post(f"/v1/publish/{subject}", content=b"m")
        same(fast, slow)
    assert lean_calls.count("PUT") == 8 and lean_calls.count("POST") == 8
    info = await js.stream_info(name)
    assert info.state.messages == 4  # 2 stored each way (the second "one" is a duplicate)


@pytest.mark.server("2.12")
async def test_counters_answer_alike(
    gateway: httpx.AsyncClient, via_fastapi: httpx.AsyncClient, nc, name: str, lean_calls: list[str]
) -> None:
    await nc.jetstream().add_stream(name=name, subjects=[f"{name}.>"], allow_msg_counter=True)
    bodies = (b'{"increment": "5"}', b'{"increment": -2}', b'{"increment": "1.5"}', b"{")
    for body in bodies:
        fast = await gateway.post(f"/v1/counters/{name}/{name}.fast", content=body)
        slow = await via_fastapi.post(f"/v1/counters/{name}/{name}.slow", content=body)
        alike(fast, slow, differ=("seq", "subject"))
    for path in (f"{name}/{name}.fast", f"{name}/{name}.none", f"{name}/{name}.*", f"b.b/{name}.a"):
        fast = await gateway.get(f"/v1/counters/{path}")
        slow = await via_fastapi.get(f"/v1/counters/{path}")
        alike(fast, slow, differ=("seq",))
    for path in (f"{name}/nowhere.x", f"{name}/{name}.*", f"b.b/{name}.a"):
        fast = await gateway.post(f"/v1/counters/{path}", content=bodies[0])
        slow = await via_fastapi.post(f"/v1/counters/{path}", content=bodies[0])
        same(fast, slow)
    assert lean_calls.count("POST") == 7 and lean_calls.count("GET") == 4
    assert (await gateway.get(f"/v1/counters/{name}/{name}.fast")).json()["value"] == "3"


async def test_core_nats_publish_and_request_answer_alike(
    gateway: httpx.AsyncClient,
    via_fastapi: httpx.AsyncClient,
    nc,
    nats_server: EmbeddedServer,
    name: str,
    lean_calls: list[str],
    how: str,
) -> None:
    from tests.integration.test_core_nats import heard

    async def respond(msg) -> None:  # type: ignore[no-untyped-def]
        await nc.publish(msg.reply, msg.data[::-1], headers={"X-Served-By": "svc"})

    await nc.subscribe(f"{name}.svc", cb=respond)
    await nc.flush()
    await heard(nats_server, f"{name}.svc")
    cases: list[tuple[str, dict[str, str], bytes]] = [
        (f"request/{name}.svc", {"Nats-Header-X-Trace": "t"}, b"abc"),  # 200, reply headers
        (f"request/{name}.svc?timeout=2s", {}, b""),
        (f"request/{name}.nobody", {}, b"x"),  # 503 nats.no_responders
        (f"request/{name}.svc?timeout=1h", {}, b"x"),  # 400 over the maximum
        (f"publish/{name}.a", {"Nats-Header-X-Trace": "t"}, b"x"),  # 202
        ("publish/$JS.API.INFO", {}, b"x"),  # 400 nats.subject_reserved
        (f"publish/{name}.*", {}, b"x"),  # 400 subject.invalid
        (f"publish/{name}.a", {"Nats-Header-X-Bad": "a\x01"}, b"x"),  # 400 header.invalid
    ]
    for path, headers, body in cases:
        fast = await gateway.post(f"/v1/nats/{path}", content=body, headers=headers)
        slow = await via_fastapi.post(f"/v1/nats/{path}", content=body, headers=headers)
        if how == "direct" and "\x01" in "".join(headers.values()):
            # On a socket, the HTTP parser refuses the control character before any app.
            assert fast.status_code == 400 and "Invalid HTTP request" in fast.text
            lean_calls.append("POST")
            continue
        same(fast, slow)
        assert fast.content == slow.content or fast.headers["content-type"].startswith(
            "application/problem+json"
        )
        assert fast.headers.get("nats-header-x-served-by") == slow.headers.get(
            "nats-header-x-served-by"
        )
    assert lean_calls.count("POST") == len(cases)


async def test_a_client_gone_mid_body_publishes_nothing_and_logs_no_error(
    nats_server: EmbeddedServer, nc, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    await nc.jetstream().add_stream(name=name, subjects=[f"{name}.>"])
    uvicorn_log = logging.getLogger("uvicorn")  # it does not propagate to the root logger
    uvicorn_log.addHandler(caplog.handler)
    try:
        await _publish_then_leave(nats_server, name)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert (await nc.jetstream().stream_info(name)).state.messages == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def _publish_then_leave(nats_server: EmbeddedServer, name: str) -> None:
    import asyncio

    from tests.helpers import served_gateway

    with served_gateway(gateway_settings(nats_server.url)) as url:
        host, port = url.removeprefix("http://").split(":")
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /v1/publish/{name}.a HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".encode()
        )
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(base_url=url) as http:  # the gateway still serves
            assert (await http.post(f"/v1/publish/{name}.b", content=b"x")).status_code == 200


async def test_the_setting_sends_everything_to_fastapi(
    nats_server: EmbeddedServer, name: str, lean_calls: list[str]
) -> None:
    async with running_gateway(gateway_settings(nats_server.url, lean_paths=False)) as gw:
        assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
        assert (await gw.put(f"/v1/kv/{name}/keys/a", content=b"v")).status_code == 200
        got = await gw.get(f"/v1/kv/{name}/keys/a")
        assert (got.status_code, got.content, got.headers["kv-revision"]) == (200, b"v", "1")
        assert (await gw.post(f"/v1/publish/{name}.x", content=b"m")).status_code == 404
        metrics = (await gw.get("/metrics")).text
    assert lean_calls == []
    assert 'route="/v1/kv/{bucket}/keys/{key}",status="200"' in metrics


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/kv/B/keys/a.b", "GET, HEAD, PUT, DELETE, OPTIONS"),
        ("/v1/publish/a.b", "POST, OPTIONS"),
    ],
)
async def test_lean_paths_leave_other_methods_to_the_router(
    gateway: httpx.AsyncClient, lean_calls: list[str], path: str, allow: str
) -> None:
    """The lean routes' paths with a method they do not serve: a 405 (and OPTIONS) naming
    every method of the resource, as on any other route; the lean paths never answer."""
    refused = await gateway.patch(path)
    assert refused.status_code == 405, refused.text
    assert refused.headers["allow"] == allow
    assert refused.json()["code"] == "route.method_not_allowed"
    options = await gateway.options(path)
    assert (options.status_code, options.headers["allow"]) == (204, allow)
    assert lean_calls == []


@pytest.mark.parametrize("lean", [True, False], ids=["direct", "fastapi"])
async def test_an_answer_before_the_whole_body_closes(
    nats_server: EmbeddedServer, tmp_path: Path, lean: bool
) -> None:
    """From the protocol as through the middleware: a request answered before its body came
    whole (refused by authentication) is answered with ``connection: close``; the rest of the
    body, sent after the answer, is read and dropped before the close, so that it does not
    reset the connection (a reset discards the answer the client has not read yet)."""
    import asyncio

    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {name: a, token: a-token-0123456789abcdef, rules: []}\n")
    settings = gateway_settings(nats_server.url, auth_file=auth, lean_paths=lean)
    with served_gateway(settings) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"PUT /v1/kv/b/keys/a HTTP/1.1\r\nHost: x\r\nContent-Length: 600000\r\n\r\n" + b"v" * 10
        )
        await writer.drain()
        await asyncio.sleep(0.3)  # answered and closed by now, unread here
        writer.write(b"v" * 599_990)
        await writer.drain()
        await asyncio.sleep(0.3)
        answer = await asyncio.wait_for(reader.read(65536), 10)
        head = answer.split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 401"), answer
        assert b"\r\nconnection: close" in head
        assert b"\r\nx-request-id: " in head
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed
        writer.close()


async def test_pipelined_requests_are_answered_in_order(
    nats_server: EmbeddedServer, name: str
) -> None:
    """Requests sent at once on one connection: a lean route's (served from the protocol), a
    HEAD of it, another route's (served by FastAPI), and the lean one again, are answered in
    the order they came, the HEAD without a body."""
    import asyncio

    with served_gateway(gateway_settings(nats_server.url)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.put(f"/v1/kv/{name}", json={})).status_code == 201
            assert (await http.put(f"/v1/kv/{name}/keys/k", content=b"value")).status_code == 200
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        get = f"GET /v1/kv/{name}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        head = f"HEAD /v1/kv/{name}/keys/k HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        other = f"GET /v1/kv/{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        writer.write(get + head + other + get)
        await writer.drain()
        received = b""
        while received.count(b"HTTP/1.1 200") < 4:
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, received
            received += chunk
        writer.close()
    answers = received.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n\r\n", 1)[1] for a in answers[:2]] == [b"value", b""]
    assert b"content-length: 5" in answers[1].lower()  # (HEAD: the GET's length, no body)
    assert answers[2].split(b"\r\n\r\n", 1)[1].startswith(b"{")  # the bucket's status
    assert answers[3].endswith(b"\r\n\r\nvalue")


@pytest.mark.parametrize(
    ("header", "value"),
    [("x-fine", "a\x01b"), ("x-fine", "a\nb"), ("x-bad name", "fine"), ("x-bad(", "fine")],
)
async def test_a_header_uvicorn_refuses_is_never_written(
    nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, header: str, value: str
) -> None:
    """The direct path refuses what uvicorn's ``send`` refuses, whatever header holds it among
    the others (one search over all names, one over all values): a 500, nothing of the
    answer."""
    from starlette.responses import Response

    async def answer(scope, receive):  # type: ignore[no-untyped-def]
        scope.pop("jsgw.lean")
        headers = {"x-before": "ok", header: value, "x-after": "ok"}
        return Response(b"body", headers=headers)

    monkeypatch.setattr(fastpath.LeanPaths, "_respond", staticmethod(answer))
    with served_gateway(gateway_settings(nats_server.url)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            response = await client.get("/v1/kv/b/keys/a")
    assert response.status_code == 500
    assert "x-before" not in response.headers and response.content != b"body"
