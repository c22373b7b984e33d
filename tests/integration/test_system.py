"""Probes, metrics, info, request ids and the served spec."""

from __future__ import annotations

import re

import httpx

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway


async def test_probes(gateway: httpx.AsyncClient) -> None:
    assert (await gateway.get("/healthz")).json() == {"status": "ok"}
    ready = await gateway.get("/readyz")
    assert ready.status_code == 200
    # Start-up waits for the first connection; the second may still be connecting.
    assert ready.json()["connections"] in (1, 2)


async def test_info(gateway: httpx.AsyncClient) -> None:
    info = (await gateway.get("/v1/info")).json()
    assert info["server"]["version"].startswith("2.")
    assert info["jetstream"]["limits"]["max_streams"] == -1
    assert info["pool"]["size"] == 2 and info["pool"]["connected"] in (1, 2)
    assert info["embedded"] is False


async def test_request_id_is_echoed_or_made(gateway: httpx.AsyncClient) -> None:
    given = await gateway.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = await gateway.get("/healthz")
    assert len(made.headers["x-request-id"]) == 32
    hostile = await gateway.get("/healthz", headers={"X-Request-ID": "a b<script>"})
    assert hostile.headers["x-request-id"] != "a b<script>"
    body = problem(await gateway.get("/v1/streams/a.b", headers={"X-Request-ID": "r-1"}), 400)
    assert body["instance"] == "r-1"


async def test_metrics_use_route_templates(gateway: httpx.AsyncClient, name: str) -> None:
    await gateway.get(f"/v1/streams/{name}")
    await gateway.get("/healthz")
    text = (await gateway.get("/metrics")).text
    assert 'route="/v1/streams/{stream}",status="404"' in text
    assert name not in text  # raw names never become label values
    assert 'route="/healthz"' not in text  # probes are left out
    up = re.search(r"^jsgw_nats_pool_connections_up (\S+)$", text, re.M)
    assert up is not None and float(up.group(1)) >= 1
    assert 'jsgw_nats_request_duration_seconds_count{operation="stream.info"}' in text
    assert "jsgw_http_requests_in_flight" in text


async def test_unknown_route_is_problem_json(gateway: httpx.AsyncClient) -> None:
    problem(await gateway.get("/v1/nothing"), 404, "route.not_found")


async def test_openapi_and_docs_are_served(gateway: httpx.AsyncClient) -> None:
    spec = (await gateway.get("/openapi.json")).json()
    assert "/v1/streams/{stream}" in spec["paths"]
    assert (await gateway.get("/docs")).status_code == 200


async def test_js_domain_is_applied_to_api_subjects(nats_server: EmbeddedServer, name: str) -> None:
    """With a domain that this server does not have, JetStream API calls reach nobody."""
    async with running_gateway(gateway_settings(nats_server.url, js_domain="elsewhere")) as gw:
        body = problem(await gw.get(f"/v1/streams/{name}"), 503, "jetstream.unavailable")
        assert "domain" in body["detail"]
        problem(await gw.get("/readyz"), 503)
