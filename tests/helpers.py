"""Helpers for the tests: an in-process gateway bound to an httpx client."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import uvicorn
from asgi_lifespan import LifespanManager

from app.config import Settings
from app.main import create_app
from app.serving import uvicorn_options


def gateway_settings(url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "nats_url": [url],
        "request_timeout": 2.0,
        "reconnect_wait": 0.2,
        "access_log": False,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, and a client that talks to it in-process."""
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=30
        ) as client:
            yield client


def problem(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """Assert a problem+json answer with this status (and code), and return it."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["status"] == status
    assert body["instance"] == response.headers["x-request-id"]
    if code is not None:
        assert body["code"] == code, body
    return body


@contextmanager
def served_gateway(settings: Settings, port: int = 0) -> Iterator[str]:
    """The app served by a real uvicorn on a free loopback port, in a thread; yields its URL.

    For streaming responses (SSE, NDJSON), which the in-process transport buffers whole.
    ``port``: serve on this one instead (to restart a gateway where its clients expect it).
    """
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
        **uvicorn_options(settings.keep_alive_timeout),  # as `jsgw serve`
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
