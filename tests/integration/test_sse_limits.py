"""Caps on open SSE streams, shared by KV watches and consumer streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway

LOOPBACK = "127.0.0.1"
TOKEN = "viewer-token-0123456789"
OTHER = "other-token-0123456789a"


def from_address(url: str, address: str, limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """A client whose connections leave from ``address`` (any of 127.0.0.0/8 on loopback)."""
    transport = httpx.AsyncHTTPTransport(
        local_address=address, limits=limits or httpx.Limits(max_connections=100)
    )
    return httpx.AsyncClient(base_url=url, timeout=10, transport=transport)


@dataclass
class Watch:
    status_code: int
    lines: AsyncIterator[str]


@contextlib.asynccontextmanager
async def open_watch(
    client: httpx.AsyncClient, bucket: str, headers: dict[str, str] | None = None
) -> AsyncIterator[Watch]:
    """A watch request, open until the block ends: 200 once its stream began, or the refusal."""
    async with client.stream("GET", f"/v1/kv/{bucket}/watch", headers=headers) as response:
        lines = response.aiter_lines()
        if response.status_code == 200:
            assert (await anext(lines)).startswith(("event:", "id:", ":"))
        else:
            await response.aread()
        yield Watch(response.status_code, lines)


async def refused(client: httpx.AsyncClient, bucket: str, **headers: str) -> dict:
    return problem(
        await client.get(f"/v1/kv/{bucket}/watch", headers=headers), 429, "sse.too_many_streams"
    )


async def test_per_client_cap_and_release(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    settings = gateway_settings(nats_server.url, sse_max_per_address=1, sse_heartbeat=1)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(name, durable_name="C", ack_policy="explicit")
    with served_gateway(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as gw:
            assert (await gw.put(f"/v1/kv/{name}", json={})).status_code == 201
            async with gw.stream("GET", f"/v1/kv/{name}/watch") as first:
                assert first.status_code == 200
                lines = first.aiter_lines()
                assert (await anext(lines)).startswith(("event:", "id:", ":"))
                # A second stream of the same client, watch or consume: 429 with Retry-After.
                again = await gw.get(f"/v1/kv/{name}/watch")
                problem(again, 429, "sse.too_many_streams")
                assert again.headers["retry-after"] == "1"
                problem(
                    await gw.get(f"/v1/streams/{name}/consumers/C/consume"),
                    429,
                    "sse.too_many_streams",
                )
            # The slot comes back when the stream ends.
            for _ in range(50):
                async with gw.stream("GET", f"/v1/streams/{name}/consumers/C/consume") as second:
                    if second.status_code == 200:
                        break
                await asyncio.sleep(0.1)
            assert second.status_code == 200


async def test_consume_says_goodbye_on_shutdown(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    from sse_starlette.sse import AppStatus

    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(name, durable_name="C", ack_policy="explicit")
    await js.publish(f"{name}.a", b"one")
    with served_gateway(gateway_settings(nats_server.url)) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as gw,
            gw.stream("GET", f"/v1/streams/{name}/consumers/C/consume") as stream,
        ):
            lines = stream.aiter_lines()
            events: list[str] = []
            while "event: message" not in events:
                events.append(await asyncio.wait_for(anext(lines), 5))
            AppStatus.should_exit = True  # what uvicorn's signal handler sets on SIGTERM
            try:
                rest = []
                async for line in lines:
                    rest.append(line)
            finally:
                AppStatus.should_exit = False
    assert "event: error" in rest
    data = next(line for line in rest if line.startswith("data:") and "gateway.shutdown" in line)
    assert "reconnect" in data


async def test_anonymous_client_addresses_have_separate_caps(
    nats_server: EmbeddedServer, name: str
) -> None:
    settings = gateway_settings(nats_server.url, sse_max_per_address=1)
    with served_gateway(settings) as url:
        async with from_address(url, LOOPBACK) as one, from_address(url, "127.0.0.2") as two:
            assert (await one.put(f"/v1/kv/{name}", json={})).status_code == 201
            async with open_watch(one, name) as first:
                assert first.status_code == 200
                body = await refused(one, name)
                assert "this client address has too many open streams" in body["detail"]
                async with open_watch(two, name) as second:
                    assert second.status_code == 200
                    await refused(two, name)
                    # Forwarding headers from a peer that is not a trusted proxy: ignored.
                    await refused(two, name, **{"X-Forwarded-For": "192.0.2.1"})
                    await refused(two, name, Forwarded="for=192.0.2.1")


async def test_a_trusted_proxys_forwarded_for_separates_clients(
    nats_server: EmbeddedServer, name: str
) -> None:
    settings = gateway_settings(nats_server.url, sse_max_per_address=1, trusted_proxies=[LOOPBACK])
    with served_gateway(settings) as url:
        async with (
            from_address(url, LOOPBACK) as proxy,
            from_address(url, "127.0.0.2") as stranger,
            contextlib.AsyncExitStack() as stack,
        ):
            assert (await proxy.put(f"/v1/kv/{name}", json={})).status_code == 201
            for client in ("192.0.2.1", "192.0.2.2", "2001:db8::1"):
                headers = {"X-Forwarded-For": f"198.51.100.9, {client}"}
                watch = await stack.enter_async_context(open_watch(proxy, name, headers))
                assert watch.status_code == 200, client
            # The same client again, whatever it wrote itself further left: refused.
            await refused(proxy, name, **{"X-Forwarded-For": "192.0.2.1"})
            await refused(proxy, name, **{"X-Forwarded-For": "203.0.113.5, 192.0.2.1"})
            # Another address of the same IPv6 /64 is the same client.
            await refused(proxy, name, **{"X-Forwarded-For": "2001:db8::2"})
            # The proxy's own requests (no header) are the proxy's address; the Forwarded
            # header is not the one the proxies set (JSGW_PROXY_HEADER), so it is ignored.
            watch = await stack.enter_async_context(open_watch(proxy, name))
            assert watch.status_code == 200
            await refused(proxy, name, Forwarded="for=192.0.2.77")
            # A peer that is not a trusted proxy names nobody but itself.
            watch = await stack.enter_async_context(
                open_watch(stranger, name, {"X-Forwarded-For": "192.0.2.50"})
            )
            assert watch.status_code == 200
            await refused(stranger, name, **{"X-Forwarded-For": "192.0.2.51"})


async def test_forwarded_header_when_chosen(nats_server: EmbeddedServer, name: str) -> None:
    settings = gateway_settings(
        nats_server.url,
        sse_max_per_address=1,
        trusted_proxies=["127.0.0.0/8"],
        proxy_header="forwarded",
    )
    with served_gateway(settings) as url:
        async with from_address(url, LOOPBACK) as proxy, contextlib.AsyncExitStack() as stack:
            assert (await proxy.put(f"/v1/kv/{name}", json={})).status_code == 201
            for forwarded in (
                'for="[2001:db8::1]:4711";proto=https',
                "for=_hidden",
                "for=192.0.2.1",
            ):
                watch = await stack.enter_async_context(
                    open_watch(proxy, name, {"Forwarded": forwarded})
                )
                assert watch.status_code == 200, forwarded
            await refused(proxy, name, Forwarded="for=192.0.2.1;by=127.0.0.1")
            await refused(proxy, name, Forwarded='for="_hidden:_port"')
            # X-Forwarded-For is not the chosen header: the client is the proxy itself.
            watch = await stack.enter_async_context(
                open_watch(proxy, name, {"X-Forwarded-For": "192.0.2.9"})
            )
            assert watch.status_code == 200
            await refused(proxy, name, **{"X-Forwarded-For": "192.0.2.10"})


async def test_a_burst_of_anonymous_watchers_is_not_capped_at_100(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """With the default caps, 300 anonymous watchers from three addresses all get their
    stream (before, every anonymous client shared one cap of 100), and every change."""
    with served_gateway(gateway_settings(nats_server.url)) as url:
        limits = httpx.Limits(max_connections=200)
        clients = [from_address(url, f"127.0.0.{n}", limits=limits) for n in (2, 3, 4)]
        async with contextlib.AsyncExitStack() as stack:
            for client in clients:
                await stack.enter_async_context(client)
            assert (await clients[0].put(f"/v1/kv/{name}", json={})).status_code == 201
            watches = await asyncio.gather(
                *(
                    stack.enter_async_context(open_watch(c, name))
                    for c in clients
                    for _ in range(100)
                )
            )
            assert [w.status_code for w in watches] == [200] * 300
            put = await clients[0].put(f"/v1/kv/{name}/keys/k", content=b"v")
            assert put.status_code in (200, 201), put.text
            revision = put.json()["revision"]

            async def sees_the_put(watch: Watch) -> None:
                async for line in watch.lines:
                    if line == f"id: {revision}":
                        return

            await asyncio.wait_for(asyncio.gather(*(sees_the_put(w) for w in watches)), 30)


async def test_a_tokens_streams_count_against_the_token_from_any_address(
    nats_server: EmbeddedServer, name: str, tmp_path: Path
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        "  - name: viewer\n"
        f'    token: "{TOKEN}"\n'
        '    rules: [{resource: "kv:*", actions: [read, admin]}]\n'
        "  - name: other\n"
        f'    token: "{OTHER}"\n'
        '    rules: [{resource: "kv:*", actions: [read]}]\n'
    )
    settings = gateway_settings(
        nats_server.url, auth_file=auth, sse_max_per_token=1, sse_max_per_address=1
    )
    viewer = {"Authorization": f"Bearer {TOKEN}"}
    with served_gateway(settings) as url:
        async with (
            from_address(url, LOOPBACK) as one,
            from_address(url, "127.0.0.2") as two,
            from_address(url, "127.0.0.3") as three,
        ):
            assert (await one.put(f"/v1/kv/{name}", json={}, headers=viewer)).status_code == 201
            minted = await one.post("/v1/auth/sse-token", headers=viewer)
            assert minted.status_code in (200, 201), minted.text
            sse_token = minted.json()["token"]
            async with open_watch(one, name, viewer) as first:
                assert first.status_code == 200
                body = await refused(two, name, **viewer)
                assert "this token has too many open streams" in body["detail"]
                # An SSE token minted for it is the same token.
                watch = await three.get(f"/v1/kv/{name}/watch", params={"access_token": sse_token})
                problem(watch, 429, "sse.too_many_streams")
                # Another token from the same address has its own cap.
                async with open_watch(one, name, {"Authorization": f"Bearer {OTHER}"}) as other:
                    assert other.status_code == 200
