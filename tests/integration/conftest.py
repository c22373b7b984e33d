"""Fixtures shared by the integration tests (the server ones are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from app.nats.replies import LeanClient
from tests.helpers import gateway_settings, running_gateway, served_gateway
from tests.spec_statuses import check_documented


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The lean paths and FastAPI's routes serve the KV, publish and watch requests alike: the
    # modules that say BOTH_PATHS run their gateway tests with the lean paths on and off.
    if getattr(metafunc.module, "BOTH_PATHS", False) and "lean_paths" in metafunc.fixturenames:
        metafunc.parametrize("lean_paths", [True, False], ids=["direct", "fastapi"])


@pytest.fixture
async def gateway(
    request: pytest.FixtureRequest, nats_server: EmbeddedServer, lean_paths: bool
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process; in a BOTH_PATHS module with the lean paths on, served on a
    socket instead, where the lean paths are answered from the HTTP protocol
    (app.fastpath.DirectPaths; their ASGI form is compared in test_fastpath.py). A test
    marked ``in_process`` sends what an HTTP parser refuses (control characters): in-process,
    where the app's own checks are what refuses it."""
    settings = gateway_settings(nats_server.url, lean_paths=lean_paths)
    served = request.node.get_closest_marker("in_process") is None
    if served and getattr(request.module, "BOTH_PATHS", False) and lean_paths:
        with served_gateway(settings) as served:
            hooks = {"response": [check_documented]}
            async with httpx.AsyncClient(base_url=served, timeout=30, event_hooks=hooks) as client:
                yield client
    else:
        async with running_gateway(settings) as client:
            yield client


@pytest.fixture
async def lean(nats_server: EmbeddedServer) -> AsyncIterator[LeanClient]:
    """A connection of the gateway's own kind (reply mux, lean parser), no reconnects."""
    client = LeanClient()
    await client.connect(servers=[nats_server.url], allow_reconnect=False)
    yield client
    if not client.is_closed:
        await client.close()


@pytest.fixture
def url(nats_server: EmbeddedServer, lean_paths: bool) -> Iterator[str]:
    """A gateway served on a loopback port (for SSE: real sockets), heartbeats every 0.5 s."""
    settings = gateway_settings(
        nats_server.url, sse_heartbeat=0.5, kv_watch_heartbeat=0.5, lean_paths=lean_paths
    )
    with served_gateway(settings) as served:
        yield served
