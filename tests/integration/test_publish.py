"""Publishing: PubAck, dedup, expectations, headers, batches, limits."""

from __future__ import annotations

import base64

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import connect_in_order, gateway_settings, problem, running_gateway
from tests.integration.test_streams import make_stream

BOTH_PATHS = True  # every test with the gateway fixture runs with JSGW_LEAN_PATHS on and off


async def stored(nc: nats.NATS, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def test_publish_returns_puback(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name)
    response = await gateway.post(f"/v1/publish/{name.lower()}.a", content=b"hello")
    assert response.status_code == 200
    assert response.json() == {"stream": name, "seq": 1, "duplicate": False}


async def test_dedup_with_msg_id_and_idempotency_key(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.a"
    first = await gateway.post(
        f"/v1/publish/{subject}", content=b"1", headers={"Nats-Msg-Id": "m1"}
    )
    again = await gateway.post(
        f"/v1/publish/{subject}", content=b"1", headers={"Nats-Msg-Id": "m1"}
    )
    alias = await gateway.post(
        f"/v1/publish/{subject}", content=b"1", headers={"Idempotency-Key": "m1"}
    )
    assert first.json()["duplicate"] is False
    assert again.json() == {"stream": name, "seq": first.json()["seq"], "duplicate": True}
    assert alias.json()["duplicate"] is True
    assert await stored(nc, name) == 1


async def test_expected_sequences_and_ids(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.a"
    ok = await gateway.post(
        f"/v1/publish/{subject}",
        content=b"1",
        headers={"Nats-Expected-Last-Sequence": "0", "Nats-Msg-Id": "x1"},
    )
    assert ok.status_code == 200
    body = problem(
        await gateway.post(
            f"/v1/publish/{subject}", content=b"2", headers={"Nats-Expected-Last-Sequence": "5"}
        ),
        412,
        "publish.wrong_last_sequence",
    )
    assert body["nats"]["err_code"] == 10071
    problem(
        await gateway.post(
            f"/v1/publish/{subject}",
            content=b"2",
            headers={"Nats-Expected-Last-Subject-Sequence": "7"},
        ),
        412,
        "publish.wrong_last_sequence",
    )
    problem(
        await gateway.post(
            f"/v1/publish/{subject}", content=b"2", headers={"Nats-Expected-Last-Msg-Id": "nope"}
        ),
        412,
        "publish.wrong_last_msg_id",
    )
    problem(
        await gateway.post(
            f"/v1/publish/{subject}", content=b"2", headers={"Nats-Expected-Stream": "OTHER"}
        ),
        412,
        "publish.wrong_stream",
    )
    good = await gateway.post(
        f"/v1/publish/{subject}",
        content=b"2",
        headers={
            "Nats-Expected-Last-Subject-Sequence": "1",
            "Nats-Expected-Last-Msg-Id": "x1",
            "Nats-Expected-Stream": name,
        },
    )
    assert good.json()["seq"] == 2
    assert await stored(nc, name) == 2


async def test_user_headers_pass_and_reserved_ones_do_not(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.h"
    ok = await gateway.post(
        f"/v1/publish/{subject}",
        content=b"x",
        headers={"Nats-Header-Tenant": "acme", "X-Other": "dropped"},
    )
    msg = await nc.jetstream().get_msg(name, ok.json()["seq"])
    assert msg.headers == {"Tenant": "acme"}
    problem(
        await gateway.post(
            f"/v1/publish/{subject}", content=b"x", headers={"Nats-Header-Nats-Rollup": "all"}
        ),
        400,
        "header.reserved",
    )
    problem(
        await gateway.post(
            f"/v1/publish/{subject}", content=b"x", headers={"Nats-Expected-Last-Sequence": "abc"}
        ),
        400,
        "header.invalid",
    )
    problem(
        await gateway.post(
            f"/v1/publish/{subject}",
            content=b"x",
            headers=[("Nats-Msg-Id", "a"), ("Nats-Msg-Id", "b")],
        ),
        400,
        "header.duplicate",
    )
    assert await stored(nc, name) == 1


@pytest.mark.in_process
async def test_header_value_with_control_characters_is_refused(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    subject = f"{name.lower()}.h"
    # httpx refuses CR/LF in header values itself; send the raw bytes through the ASGI scope.
    for value in (b"a\x00b", b"a\x01b", b"a\x7fb"):
        response = await gateway.post(
            f"/v1/publish/{subject}", content=b"x", headers=[(b"Nats-Msg-Id", value)]
        )
        problem(response, 400, "header.invalid")
    assert await stored(nc, name) == 0


async def test_bad_subjects(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_stream(gateway, name)
    base = name.lower()
    for bad in [
        f"{base}.*",
        f"{base}.>",
        f"{base}..x",
        f"{base}.",
        f"{base}.a%20b",
        f"{base}.a%0D%0Ab",
        f"{base}.a%09b",
    ]:
        problem(await gateway.post(f"/v1/publish/{bad}", content=b"x"), 400, "subject.invalid")
    for reserved in ["$JS.API.STREAM.DELETE.X", "$SYS.REQ.SERVER.PING", "_INBOX.abc", "$JSC.x"]:
        problem(
            await gateway.post(f"/v1/publish/{reserved}", content=b"x"), 403, "subject.reserved"
        )
    assert await stored(nc, name) == 0


async def test_no_stream_is_404_not_503(gateway: httpx.AsyncClient, name: str) -> None:
    problem(await gateway.post(f"/v1/publish/{name}.nobody", content=b"x"), 404, "stream.no_match")


async def test_body_over_max_payload(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_stream(gateway, name)
    big = b"x" * (nc.max_payload + 1)
    problem(await gateway.post(f"/v1/publish/{name.lower()}.a", content=big), 413)

    async def chunks():
        for _ in range(20):
            yield b"y" * 65536

    problem(await gateway.post(f"/v1/publish/{name.lower()}.a", content=chunks()), 413)
    assert await stored(nc, name) == 0


@pytest.mark.server("2.11")
async def test_ttl_header(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_stream(gateway, name, allow_msg_ttl=True)
    ok = await gateway.post(
        f"/v1/publish/{name.lower()}.t", content=b"x", headers={"Nats-TTL": "1m"}
    )
    assert ok.status_code == 200
    msg = await nc.jetstream().get_msg(name, ok.json()["seq"])
    assert msg.headers["Nats-TTL"] == "60s"
    problem(
        await gateway.post(
            f"/v1/publish/{name.lower()}.t", content=b"x", headers={"Nats-TTL": "soon"}
        ),
        400,
        "header.invalid",
    )
    problem(
        await gateway.post(
            f"/v1/publish/{name.lower()}.t", content=b"x", headers={"Nats-TTL": "10ms"}
        ),
        400,
        "header.invalid",
    )


async def test_batch_one_result_per_message(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    base = name.lower()
    messages = [
        {"subject": f"{base}.1", "data": base64.b64encode(b"one").decode(), "msg_id": "b1"},
        {
            "subject": f"{base}.2",
            "data": base64.b64encode(b"two").decode(),
            "headers": {"Nats-Expected-Last-Sequence": "99"},
        },
        {"subject": f"{base}.3", "headers": {"Tenant": "acme"}},
        {"subject": f"{name}.unrouted.x"},
        {"subject": f"{base}.1", "data": base64.b64encode(b"one").decode(), "msg_id": "b1"},
    ]
    response = await gateway.post("/v1/publish", json={"messages": messages})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["ok"] for r in results] == [True, False, True, False, True]
    assert results[0]["ack"]["seq"] == 1
    assert results[1]["error"]["code"] == "publish.wrong_last_sequence"
    assert results[2]["ack"]["seq"] == 2
    assert results[3]["error"]["code"] == "stream.no_match"
    assert results[4]["ack"] == {"stream": name, "seq": 1, "duplicate": True}
    assert await stored(nc, name) == 2


async def test_batch_with_an_invalid_item_publishes_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_stream(gateway, name)
    base = name.lower()
    for bad in (
        {"subject": f"{base}.*"},
        {"subject": f"{base}.ok", "data": "%%%not-base64"},
        {"subject": f"{base}.ok", "headers": {"Nats-Rollup": "all"}},
        {"subject": f"{base}.ok", "msg_id": "a\r\nb"},
        {"subject": f"{base}.ok", "unknown": 1},
    ):
        body = {"messages": [{"subject": f"{base}.fine"}, bad]}
        problem(await gateway.post("/v1/publish", json=body), 400)
    problem(await gateway.post("/v1/publish", json={"messages": []}), 400)
    assert await stored(nc, name) == 0


async def test_batch_size_cap(nats_server: EmbeddedServer, name: str) -> None:
    async with running_gateway(gateway_settings(nats_server.url, max_publish_batch=2)) as gw:
        body = {"messages": [{"subject": f"{name}.a"}] * 3}
        problem(await gw.post("/v1/publish", json=body), 413, "publish.batch_too_large")


async def test_unconfirmed_write_is_outcome_unknown(nats_server: EmbeddedServer, name: str) -> None:
    """A write whose PubAck never comes is a 504 'outcome unknown', not a failure."""
    silent = await connect_in_order(nats_server.url)
    received: list[bytes] = []

    async def swallow(msg: nats.aio.msg.Msg) -> None:
        received.append(msg.data)

    await silent.subscribe(f"{name}.silent", cb=swallow)
    await silent.flush()
    try:
        async with running_gateway(gateway_settings(nats_server.url, request_timeout=0.3)) as gw:
            response = await gw.post(
                f"/v1/publish/{name}.silent", content=b"x", headers={"Nats-Msg-Id": "u1"}
            )
            body = problem(response, 504, "nats.outcome_unknown")
            assert "Nats-Msg-Id" in body["detail"]
            assert received == [b"x"]  # it did go out: the outcome really is unknown
    finally:
        await silent.close()


@pytest.mark.parametrize("path", ["/v1/publish/a.b", "/v1/publish"])
async def test_wrong_method(gateway: httpx.AsyncClient, path: str) -> None:
    problem(await gateway.get(path), 405)
