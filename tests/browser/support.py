"""Helpers of the browser tests: the plain EventSource page, its events, bucket set-up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx
from playwright.async_api import Page, Route, expect

PAGES = Path(__file__).resolve().parent / "pages"

Event = dict[str, str | None]


async def open_event_source(page: Page, base_url: str, src: str) -> None:
    """Load the page with a plain EventSource on ``src``, served on the gateway's origin."""

    async def serve(route: Route) -> None:
        await route.fulfill(path=PAGES / "watch.html", content_type="text/html")

    await page.route(f"{base_url}/__test__/watch.html*", serve)
    await page.goto(f"{base_url}/__test__/watch.html?src={quote(src, safe='')}")


async def settled(page: Page) -> None:
    """Until the console has drawn what its last action asked for: after a save it draws the
    view again, and ``#view`` is aria-busy until that is done (a test that used the old view
    in the meantime typed into a form about to be replaced)."""
    await expect(page.locator("#view")).not_to_have_attribute("aria-busy", "true")


async def events(page: Page) -> list[Event]:
    return await page.evaluate("window.events")


async def wait_for_events(
    page: Page, done: Callable[[list[Event]], bool], timeout: float = 10.0
) -> list[Event]:
    """The page's events once ``done`` holds for them (AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = await events(page)
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not get the expected events in {timeout}s: {seen}")
        await asyncio.sleep(0.05)


def changes(seen: list[Event]) -> list[tuple[str, str | None]]:
    """(event, id) of the KV events, in the order the page got them."""
    return [(e["kind"], e["id"]) for e in seen if e["kind"] in ("put", "delete", "purge")]


async def create_bucket(
    base_url: str, bucket: str, token: str | None = None, **config: object
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as http:
        response = await http.put(f"/v1/kv/{bucket}", json=config)
        assert response.status_code == 201, response.text


class SentHeaders:
    """The request headers Chromium really sent (DevTools' raw view), in the order sent.

    Playwright's own request objects show only the headers the page set for an EventSource,
    not those the browser adds itself, such as Last-Event-ID on a reconnect.
    """

    def __init__(self) -> None:
        self._urls: dict[str, str] = {}
        self._sent: list[tuple[str, dict[str, str]]] = []

    @classmethod
    async def attach(cls, page: Page) -> SentHeaders:
        log = cls()
        cdp = await page.context.new_cdp_session(page)
        cdp.on("Network.requestWillBeSent", log._on_request)
        cdp.on("Network.requestWillBeSentExtraInfo", log._on_headers)
        await cdp.send("Network.enable")
        return log

    def _on_request(self, event: dict) -> None:
        self._urls[event["requestId"]] = event["request"]["url"]

    def _on_headers(self, event: dict) -> None:
        headers = {k.lower(): v for k, v in event["headers"].items()}
        self._sent.append((event["requestId"], headers))

    def matching(self, fragment: str) -> list[dict[str, str]]:
        """Headers of every request whose URL contains ``fragment``."""
        return [h for rid, h in self._sent if fragment in self._urls.get(rid, "")]


AXE = (
    Path(__file__).resolve().parents[2]
    / ".venv"
    / "axe"
    / "node_modules"
    / "axe-core"
    / "axe.min.js"
)
# What the console must not have: axe-core's serious and critical findings.
AXE_BLOCKING = ("serious", "critical")


async def axe_violations(page: Page) -> list[dict[str, object]]:
    """axe-core's serious and critical violations on the page as it is (axe injected from
    the npm package `make test` installs; the test skips without it)."""
    import pytest

    if not AXE.is_file():
        pytest.skip(f"no axe-core at {AXE}: `make test` installs it with npm")
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.add_script_tag(path=str(AXE))
    result = await page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
    )
    return [v for v in result if v["impact"] in AXE_BLOCKING]
