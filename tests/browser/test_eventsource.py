"""KV watch feeds in a real browser: a plain EventSource, its events, and its own reconnects."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from urllib.parse import urlsplit

import nats
from playwright.async_api import Page
from sse_starlette.sse import AppStatus

from app.nats.embedded import EmbeddedServer
from tests.browser.support import (
    SentHeaders,
    changes,
    create_bucket,
    open_event_source,
    wait_for_events,
)
from tests.helpers import gateway_settings, served_gateway


async def last_seq(nc: nats.NATS, bucket: str) -> int:
    return (await nc.jetstream().stream_info(f"KV_{bucket}")).state.last_seq


async def test_event_source_gets_values_ready_puts_and_deletes(
    base_url: str, page: Page, nc: nats.NATS, name: str
) -> None:
    await create_bucket(base_url, name, history=5)
    kv = await nc.jetstream().key_value(name)
    first = await kv.put("a", b"one")
    second = await kv.put("b", b"two")

    await open_event_source(page, base_url, f"/v1/kv/{name}/watch")
    await wait_for_events(page, lambda seen: any(e["kind"] == "ready" for e in seen))
    third = await kv.put("a", b"three")
    await kv.delete("b")
    deleted = await last_seq(nc, name)

    seen = await wait_for_events(page, lambda seen: len(changes(seen)) >= 4)
    kinds = [(e["kind"], e["id"]) for e in seen if e["kind"] != "open"]
    assert kinds == [
        ("put", str(first)),
        ("put", str(second)),
        ("ready", str(second)),
        ("put", str(third)),
        ("delete", str(deleted)),
    ]
    entries = [json.loads(e["data"]) for e in seen if e["kind"] in ("put", "delete")]
    assert [(x["key"], x["operation"], x["revision"]) for x in entries] == [
        ("a", "PUT", first),
        ("b", "PUT", second),
        ("a", "PUT", third),
        ("b", "DEL", deleted),
    ]
    assert base64.b64decode(entries[2]["value"]) == b"three"
    assert json.loads(next(e for e in seen if e["kind"] == "ready")["data"]) == {"revision": second}


async def test_browser_reconnect_resumes_with_last_event_id(
    page: Page, nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """The gateway goes away while writes go on; the browser reconnects by itself to the
    restarted gateway, sending Last-Event-ID, and gets every revision exactly once."""
    settings = gateway_settings(nats_server.url, kv_watch_heartbeat=0.5)
    first_gateway = contextlib.ExitStack()
    base_url = first_gateway.enter_context(served_gateway(settings))
    port = urlsplit(base_url).port
    assert port is not None
    # History enough to keep every revision of the test: a resume can only replay what the
    # bucket still holds.
    await create_bucket(base_url, name, history=64)
    kv = await nc.jetstream().key_value(name)
    sent = await SentHeaders.attach(page)

    written: list[int] = []
    stop = asyncio.Event()

    async def writer() -> None:
        # Five keys, so that a reconnect without Last-Event-ID (current values) would show.
        i = 0
        while not stop.is_set():
            written.append(await kv.put(f"k{i % 5}", str(i).encode()))
            i += 1
            await asyncio.sleep(0.04)

    await open_event_source(page, base_url, f"/v1/kv/{name}/watch")
    await wait_for_events(page, lambda seen: any(e["kind"] == "ready" for e in seen))
    writing = asyncio.create_task(writer())
    try:
        await wait_for_events(page, lambda seen: len(changes(seen)) >= 10)
        # As on SIGTERM: the gateway ends its streams (an error event, then the end), and stops.
        AppStatus.should_exit = True
        try:
            await asyncio.to_thread(first_gateway.close)
        finally:
            AppStatus.should_exit = False
        before_drop = changes(await page.evaluate("window.events"))
        await asyncio.sleep(0.5)  # writes go on while no gateway is there
        with served_gateway(settings, port=port):
            written_while_away = written[len(before_drop) :]
            await wait_for_events(
                page, lambda seen: sum(e["kind"] == "open" for e in seen) >= 2, timeout=15
            )
            await asyncio.sleep(0.5)
            stop.set()
            await writing
            seen = await wait_for_events(
                page, lambda seen: any(e.get("id") == str(written[-1]) for e in seen)
            )
            await page.evaluate("source.close()")
    finally:
        stop.set()
        await writing
        first_gateway.close()

    assert any(
        e["kind"] == "error" and e["data"] and json.loads(e["data"])["code"] == "gateway.shutdown"
        for e in seen
    ), seen
    revisions = [int(i) for kind, i in changes(seen) if i is not None]
    assert revisions == written, "every revision exactly once, in order"
    assert written_while_away, "writes went on while no gateway was there"
    watch_requests = sent.matching(f"/v1/kv/{name}/watch")
    assert len(watch_requests) == 2, watch_requests
    assert "last-event-id" not in watch_requests[0]
    assert watch_requests[1]["last-event-id"] == before_drop[-1][1], before_drop[-1]
