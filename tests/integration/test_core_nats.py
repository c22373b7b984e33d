"""Core NATS publish and request/reply over HTTP (no JetStream acks), against nats-py peers."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from app.nats.embedded import EmbeddedServer
from tests.helpers import problem
from tests.integration.test_streams import make_stream

BOTH_PATHS = True  # every test with the gateway fixture runs with JSGW_LEAN_PATHS on and off

PROBE = b"probe"


async def heard(nats_server: EmbeddedServer, subject: str) -> None:
    """Wait until a request on ``subject`` reaches its subscriber. A test's responder is a
    nats-py subscription, and nats-py's ``flush`` sends its PING ahead of the SUB still queued
    (app.nats.replies.LeanClient.flush_in_order): for a moment after it, a request may get the
    no-responders status. So the responder is probed from a connection of its own before the
    gateway is asked (probes carry PROBE)."""
    probe = await nats.connect(nats_server.url)
    try:
        for _ in range(100):
            try:
                await probe.request(subject, PROBE, timeout=0.3)
                return
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.02)
            except nats.errors.TimeoutError:
                return  # delivered, not answered (a silent subscriber)
        raise AssertionError(f"no subscriber on {subject} was ever reached")
    finally:
        await probe.close()


RESERVED = [
    "$JS.API.INFO",
    "$JS.API.STREAM.DELETE.X",
    "$JSC.x",
    "$KV.bucket.key",
    "$O.bucket.M.x",
    "$SYS.REQ.SERVER.PING",
    "$NRG.x",
    "$SRV.PING",
    "$MQTT.x",
    "$GR.x",
    "_INBOX.abc",
    "_INBOX.abc.1",
    "_R_.abc",
    "_GR_.x",
    "$",
]


async def test_publish_reaches_subscribers_with_user_headers(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    subject = f"{name}.greet"
    sub = await nc.subscribe(subject)
    await nc.flush()
    response = await gateway.post(
        f"/v1/nats/publish/{subject}",
        content=b"hello",
        headers={"Nats-Header-X-Trace": "t-1", "Nats-Msg-Id": "not-passed"},
    )
    assert response.status_code == 202, response.text
    assert response.content == b""
    msg = await sub.next_msg(timeout=2)
    assert msg.data == b"hello"
    assert msg.headers == {"X-Trace": "t-1"}


async def test_publish_to_a_stream_subject_is_stored_without_an_ack(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.core"
    response = await gateway.post(f"/v1/nats/publish/{subject}", content=b"x")
    assert response.status_code == 202
    js = nc.jetstream()
    for _ in range(100):
        if (await js.stream_info(name)).state.messages == 1:
            break
        await asyncio.sleep(0.02)
    assert (await js.stream_info(name)).state.messages == 1
    assert (await js.get_last_msg(name, subject)).data == b"x"


@pytest.mark.parametrize("route", ["publish", "request"])
async def test_reserved_namespaces_and_bad_subjects_are_refused(
    gateway: httpx.AsyncClient, nc: nats.NATS, route: str
) -> None:
    # A listener on every reserved subject would see a leak (none of these is published).
    seen: list[str] = []

    async def leak(msg: Msg) -> None:
        seen.append(msg.subject)

    listened = ("$KV.>", "$O.>", "_R_.>", "$SRV.>")
    subs = [await nc.subscribe(subject, cb=leak) for subject in listened]
    await nc.flush()
    for subject in RESERVED:
        body = problem(
            await gateway.post(f"/v1/nats/{route}/{quote(subject)}", content=b"x"),
            400,
            "nats.subject_reserved",
        )
        assert "reserved" in body["detail"]
    for subject in ("a.*", "a.>", ">", "a..b", "a b", ".a", "a.", "a\r\nPUB x 1"):
        problem(
            await gateway.post(f"/v1/nats/{route}/{quote(subject)}", content=b"x"),
            400,
            "subject.invalid",
        )
    await nc.flush()
    await asyncio.sleep(0.1)
    assert seen == []
    for sub in subs:
        await sub.unsubscribe()


@pytest.mark.in_process
@pytest.mark.parametrize("route", ["publish", "request"])
async def test_headers_are_checked(gateway: httpx.AsyncClient, name: str, route: str) -> None:
    url = f"/v1/nats/{route}/{name}.h"
    problem(
        await gateway.post(url, content=b"x", headers={"Nats-Header-Nats-Msg-Id": "x"}),
        400,
        "header.reserved",
    )
    problem(
        await gateway.post(url, content=b"x", headers={"Nats-Header-X-Bad": "a\x01b"}),
        400,
        "header.invalid",
    )
    problem(
        await gateway.post(
            url, content=b"x", headers=[("Nats-Header-X-A", "1"), ("nats-header-x-a", "2")]
        ),
        400,
        "header.duplicate",
    )


@pytest.mark.parametrize("route", ["publish", "request"])
async def test_body_over_max_payload_is_413(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, route: str
) -> None:
    sub = await nc.subscribe(f"{name}.big")
    await nc.flush()
    big = b"x" * (nc.max_payload + 1)
    problem(await gateway.post(f"/v1/nats/{route}/{name}.big", content=big), 413)
    # Headers count too: the server would close the connection over a message this size.
    fits = b"x" * (nc.max_payload - 10)
    problem(
        await gateway.post(
            f"/v1/nats/{route}/{name}.big", content=fits, headers={"Nats-Header-X-Pad": "p" * 64}
        ),
        413,
        "message.too_large",
    )
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.2)
    # The gateway's connections are still up.
    assert (await gateway.post(f"/v1/nats/publish/{name}.big", content=b"ok")).status_code == 202
    assert (await sub.next_msg(timeout=2)).data == b"ok"


async def test_request_gets_the_reply_and_its_headers(
    gateway: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    got: list[Msg] = []

    async def respond(msg: Msg) -> None:
        if msg.data != PROBE:
            got.append(msg)
        await nc.publish(
            msg.reply,
            msg.data.upper(),
            headers={"X-Served-By": "svc-1", "X-Echo": (msg.headers or {}).get("X-Trace", "")},
        )

    await nc.subscribe(f"{name}.svc", cb=respond)
    await nc.flush()
    await heard(nats_server, f"{name}.svc")
    response = await gateway.post(
        f"/v1/nats/request/{name}.svc",
        content=b"ping",
        headers={"Nats-Header-X-Trace": "abc"},
    )
    assert response.status_code == 200, response.text
    assert response.content == b"PING"
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["nats-header-x-served-by"] == "svc-1"
    assert response.headers["nats-header-x-echo"] == "abc"
    assert [m.headers for m in got] == [{"X-Trace": "abc"}]


async def test_an_empty_reply_is_not_no_responders(
    gateway: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    async def respond(msg: Msg) -> None:
        await nc.publish(msg.reply, b"")

    await nc.subscribe(f"{name}.empty", cb=respond)
    await nc.flush()
    await heard(nats_server, f"{name}.empty")
    response = await gateway.post(f"/v1/nats/request/{name}.empty", content=b"")
    assert response.status_code == 200, response.text
    assert response.content == b""


async def test_no_responders_and_timeout_are_told_apart(
    gateway: httpx.AsyncClient, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    started = time.monotonic()
    problem(
        await gateway.post(f"/v1/nats/request/{name}.nobody", content=b"x"),
        503,
        "nats.no_responders",
    )
    assert time.monotonic() - started < 1.0  # the server says so at once

    silent = await nc.subscribe(f"{name}.silent")  # listens, never answers
    await nc.flush()
    await heard(nats_server, f"{name}.silent")
    assert (await silent.next_msg(timeout=1)).data == PROBE
    started = time.monotonic()
    problem(
        await gateway.post(f"/v1/nats/request/{name}.silent?timeout=300ms", content=b"x"),
        504,
        "nats.timeout",
    )
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.5, elapsed
    assert (await silent.next_msg(timeout=1)).data == b"x"  # sent once
    with pytest.raises(nats.errors.TimeoutError):
        await silent.next_msg(timeout=0.1)


async def test_request_timeout_is_bounded(gateway: httpx.AsyncClient, name: str) -> None:
    for timeout in ("31", "1h", "0", "-1", "soon", "1e3"):
        problem(
            await gateway.post(f"/v1/nats/request/{name}.t?timeout={timeout}", content=b"x"),
            400,
        )
