"""Helpers for the tests: an in-process gateway bound to an httpx client."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import nats
import uvicorn
from asgi_lifespan import LifespanManager

from app.config import Settings
from app.main import create_app
from app.serving import uvicorn_options
from tests.spec_statuses import check_documented


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
            transport=transport,
            base_url="http://gateway",
            timeout=30,
            event_hooks={"response": [check_documented]},
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
    # A gateway that outlives this would go on in the test process, beside later tests. (Not
    # in the finally: a failure of the test itself is what it reports then.)
    assert not thread.is_alive(), "the gateway did not stop within 15 s"


@contextmanager
def jsgw_serve(
    settings: dict[str, str],
    log: Path,
    *,
    ready: str | None,
    verify: ssl.SSLContext | bool = True,
    environ: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m app serve`` in a process of its own, as users start it: the environment
    without the caller's ``JSGW_*`` variables, plus ``settings`` (and other ``environ``); the
    code is this checkout's, or ``JSGW_TEST_CHECKOUT``'s (to measure another). Waits until
    ``ready`` (a URL, e.g. its /readyz) answers 200, unless None; stops the process on exit.
    Its stderr goes to ``log``, which a failure to start shows."""
    checkout = os.environ.get("JSGW_TEST_CHECKOUT") or str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSGW_")}
    env.update({"PYTHONPATH": checkout, **(environ or {}), **settings})
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve"],
            env=env,
            cwd=checkout,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        if ready is not None:
            # One client for every try: a new one costs about as much CPU as the try, which
            # the starting gateway needs.
            with httpx.Client(verify=verify, timeout=1) as probe:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if probe.get(ready).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
            stuck = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stuck = True
    # (Not in the finally: a failure of the test itself is what it reports then.)
    if stuck:
        raise AssertionError(
            f"the gateway did not stop within 30 s of SIGTERM:\n{log.read_text()[-4000:]}"
        )


class InOrderFlush(nats.NATS):
    """nats-py's client whose ``flush`` also covers the commands still queued when it is
    called: nats-py writes its PING ahead of them (a SUB just made), so its PONG can come back
    before the server has the subscription, and a gateway's message published right after was
    then missed now and then. The second PING goes out after them
    (app.nats.replies.LeanClient.flush_in_order does it with nats-py's flusher)."""

    async def flush(self, timeout: int = 10) -> None:
        await super().flush(timeout)
        await super().flush(timeout)


async def connect_in_order(url: str, **options: object) -> nats.NATS:
    """A nats-py connection whose ``flush`` covers a subscription just made."""
    client = InOrderFlush()
    await client.connect(url, **options)
    return client
