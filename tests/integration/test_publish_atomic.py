"""Atomic batches (ADR-50): all stored in one stream or none, every refusal one problem, and
never a batch left open on the server."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway, served_gateway
from tests.integration.test_streams import make_stream

pytestmark = pytest.mark.server("2.12")


async def stored(nc: nats.NATS, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


def batch(subjects: list[str], headers: dict[int, dict[str, str]] | None = None) -> dict:
    messages: list[dict] = []
    for i, subject in enumerate(subjects):
        item: dict = {"subject": subject, "data": base64.b64encode(b"m%d" % i).decode()}
        if headers and i in headers:
            item["headers"] = headers[i]
        messages.append(item)
    return {"messages": messages}


async def test_all_or_nothing(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_stream(gateway, name, allow_atomic=True)
    base = name.lower()
    atomic = "/v1/publish?atomic=true"

    ok = await gateway.post(atomic, json=batch([f"{base}.a", f"{base}.b", f"{base}.a"]))
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body == {"stream": name, "seq": 3, "batch": body["batch"], "count": 3}
    assert 1 <= len(body["batch"]) <= 64
    last = await nc.jetstream().get_msg(name, 3)
    assert last.headers is not None and last.headers["Nats-Batch-Commit"] == "1"

    # The third message's precondition fails at the commit: none of the three is stored.
    broken = batch(
        [f"{base}.c", f"{base}.d", f"{base}.b"],
        {2: {"Nats-Expected-Last-Subject-Sequence": "1"}},
    )
    body = problem(await gateway.post(atomic, json=broken), 412, "publish.wrong_last_sequence")
    assert body["nats"]["err_code"] == 10071
    assert await stored(nc, name) == 3

    # A batch already stored (its Nats-Msg-Id within the duplicate window) is refused whole.
    with_ids = batch([f"{base}.e", f"{base}.f"], {0: {"Nats-Msg-Id": "once"}})
    assert (await gateway.post(atomic, json=with_ids)).json()["seq"] == 5
    problem(await gateway.post(atomic, json=with_ids), 409, "publish.batch_duplicate")
    assert await stored(nc, name) == 5

    # What the server refuses in atomic batches is refused before anything is sent.
    for headers in (
        {1: {"Nats-Expected-Last-Msg-Id": "x"}},
        {1: {"Nats-Expected-Last-Sequence": "5"}},
        {0: {"Nats-Msg-Id": "twice"}, 1: {"Nats-Msg-Id": "twice"}},
    ):
        body = problem(
            await gateway.post(atomic, json=batch([f"{base}.g", f"{base}.h"], headers)),
            400,
            "publish.batch_invalid",
        )
        assert body["detail"].startswith("messages[1]: "), body
    same_subject = batch(
        [f"{base}.g", f"{base}.g"], {1: {"Nats-Expected-Last-Subject-Sequence": "0"}}
    )
    problem(await gateway.post(atomic, json=same_subject), 400, "publish.batch_invalid")

    # One stream per batch; a subject no stream captures is named.
    other = f"{name}X"
    await make_stream(gateway, other, allow_atomic=True)
    body = problem(
        await gateway.post(atomic, json=batch([f"{base}.i", f"{other.lower()}.i"])),
        409,
        "publish.batch_streams",
    )
    assert name in body["detail"] and other in body["detail"]
    body = problem(
        await gateway.post(atomic, json=batch([f"{base}.i", f"{name}.nowhere"])),
        404,
        "stream.no_match",
    )
    assert body["detail"].startswith("messages[1]: ")
    problem(
        await gateway.post(atomic, json=batch([f"{base}.j"] * 1001)), 413, "publish.batch_too_large"
    )
    assert await stored(nc, name) == 5

    # A stream without allow_atomic: 409 from the server's err_code, nothing stored.
    plain = f"{name}P"
    await make_stream(gateway, plain)
    body = problem(
        await gateway.post(atomic, json=batch([f"{plain.lower()}.a", f"{plain.lower()}.b"])),
        409,
        "publish.atomic_not_allowed",
    )
    assert body["nats"]["err_code"] == 10174
    assert await stored(nc, plain) == 0
    # ... which the plain batch stores one by one, as before.
    plain_batch = await gateway.post("/v1/publish", json=batch([f"{plain.lower()}.a"]))
    assert plain_batch.json()["results"][0]["ok"] is True


def test_never_left_open(tmp_path: Path) -> None:
    """With room for one open batch per stream and three messages per batch, a batch left
    open would make the next one 429: a body cut short sends nothing, an answered batch
    leaves nothing open, the server's own limit is a 413, and a commit whose ack does not
    come in time is a 504 after which the batch is stored whole or not at all, and closed."""
    config = tmp_path / "batch.conf"
    config.write_text("jetstream { limits { batch { max_inflight_per_stream: 1, max_msgs: 3 } } }")
    server = EmbeddedServer(
        tmp_path / "store", extra_args=["-c", str(config)], log_file=tmp_path / "server.log"
    )
    server.start()
    try:
        settings = gateway_settings(server.url, request_timeout=0.3)
        with served_gateway(settings) as url, httpx.Client(base_url=url, timeout=10) as client:
            name = "ATOMIC"
            config = {"subjects": ["atomic.>"], "allow_atomic": True}
            assert client.put(f"/v1/streams/{name}", json=config).status_code == 201
            three = batch(["atomic.a", "atomic.b", "atomic.c"])

            # A client that goes away while sending the body: nothing sent.
            host, port = url.removeprefix("http://").split(":")
            head = (
                "POST /v1/publish?atomic=true HTTP/1.1\r\nHost: gateway\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            )
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(head.encode() + httpx.Request("POST", url, json=three).content)
                time.sleep(0.2)

            def messages() -> int:
                return int(client.get(f"/v1/streams/{name}").json()["state"]["messages"])

            assert messages() == 0
            for _ in range(2):  # one after the other: the first left nothing open
                ok = client.post("/v1/publish?atomic=true", json=three)
                assert ok.status_code == 200, ok.text
            assert messages() == 6

            four = batch(["atomic.a", "atomic.b", "atomic.c", "atomic.d"])
            body = problem(
                client.post("/v1/publish?atomic=true", json=four), 413, "publish.batch_too_large"
            )
            assert body["nats"]["err_code"] == 10199
            assert messages() == 6

            # The server stops answering after taking the batch (its subjects' stream is
            # known to the gateway by now, so only the commit's ack is awaited).
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)
            try:
                response = client.post("/v1/publish?atomic=true", json=three)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            body = problem(response, 504, "nats.outcome_unknown")
            assert "whole or not at all" in body["detail"]
            metric = 'jsgw_publish_outcome_unknown_total{operation="publish_atomic"} 1.0'
            assert metric in client.get("/metrics").text
            deadline = time.monotonic() + 5
            while True:  # the next batch is taken once the server has caught up
                ok = client.post("/v1/publish?atomic=true", json=three)
                if ok.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert ok.status_code == 200, ok.text
            assert messages() in (9, 12)  # the unknown batch whole, or none of it
    finally:
        server.stop()


async def test_the_batch_headers_cannot_take_a_message_past_max_payload(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """A message that fits max_payload on its own but not with the batch headers is refused
    (413, nothing sent): sent, the server would close the pooled connection it came on."""
    reconnects = re.compile(r"^jsgw_nats_reconnects_total (\S+)$", re.M)
    # (room for a message of max_payload in base64)
    settings = gateway_settings(nats_server.url, max_json_body=2 * nc.max_payload)
    async with running_gateway(settings) as gateway:

        async def reconnected() -> float:
            found = reconnects.search((await gateway.get("/metrics")).text)
            assert found is not None
            return float(found.group(1))

        await make_stream(gateway, name, allow_atomic=True)
        low = name.lower()
        before = await reconnected()
        big = {
            "subject": f"{low}.big",
            "data": base64.b64encode(b"x" * (nc.max_payload - 20)).decode(),
        }
        small = {"subject": f"{low}.small", "data": ""}
        body = problem(
            await gateway.post("/v1/publish?atomic=true", json={"messages": [small, big]}),
            413,
            "message.too_large",
        )
        assert body["detail"].startswith("messages[1]: with the batch headers"), body
        # The pool's connections stayed up: the next batch is answered, nothing reconnected.
        ok = await gateway.post("/v1/publish?atomic=true", json={"messages": [small]})
        assert ok.status_code == 200, ok.text
        await asyncio.sleep(0.3)  # (longer than the gateway's reconnect_wait)
        assert await reconnected() == before
        assert await stored(nc, name) == 1
