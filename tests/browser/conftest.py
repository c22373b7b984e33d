"""Real-browser tests: Debian's headless Chromium driven by Playwright, against a real gateway.

Playwright drives the system browser (``/usr/bin/chromium``, Debian's ``chromium`` package);
``playwright install`` is never needed. The tests skip only when that browser is missing or
cannot start here, and say so.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, Error, Page, Request, async_playwright

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway

CHROMIUM = Path(os.environ.get("JSGW_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    """A fresh Chromium (new profile in a temporary directory) for one test."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's 'chromium' package "
            "(apt-get install chromium; `make test` does it when run as root)"
        )
    async with async_playwright() as playwright:
        try:
            context = await playwright.chromium.launch_persistent_context(
                tmp_path / "chromium-profile",
                executable_path=str(CHROMIUM),
                headless=True,
                args=FLAGS,
                viewport={"width": 1280, "height": 860},
            )
        except Error as exc:
            pytest.skip(f"{CHROMIUM} cannot start here: {exc.message.splitlines()[0]}")
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def page(browser: BrowserContext) -> AsyncIterator[Page]:
    """A tab; a JavaScript error in it fails the test."""
    tab = browser.pages[0] if browser.pages else await browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    assert not errors, f"JavaScript errors in the page: {errors}"


@pytest.fixture
async def strict_page(page: Page) -> AsyncIterator[Page]:
    """The page, failing the test on a console error or a failed request.

    A request the browser aborts because the test loaded another document (``page.goto``
    while the view still reads) is the test's doing, not a failure: an abort counts only
    when no new document was loaded in the tab after that request started. The console
    itself never aborts a request.
    """
    problems: list[str] = []
    documents = 0  # documents loaded in the tab so far
    started: dict[Request, int] = {}
    aborted: list[tuple[Request, int]] = []

    def loaded(_: Page) -> None:
        nonlocal documents
        documents += 1

    def failed(request: Request) -> None:
        if request.failure == "net::ERR_ABORTED":
            aborted.append((request, started.get(request, documents)))
        else:
            problems.append(f"failed: {request.url} {request.failure}")

    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    page.on("domcontentloaded", loaded)
    page.on("request", lambda request: started.setdefault(request, documents))
    page.on("requestfailed", failed)
    yield page
    problems += [
        f"failed: {request.url} {request.failure}"
        for request, document in aborted
        if document == documents
    ]
    assert not problems, problems


@pytest.fixture
def base_url(nats_server: EmbeddedServer) -> Iterator[str]:
    """A gateway served by uvicorn on a loopback port, auth off.

    Ask for it before ``page``: fixtures end in reverse order, so the browser then closes its
    streams before the gateway stops (which otherwise waits for them).
    """
    settings = gateway_settings(nats_server.url, kv_watch_heartbeat=0.5)
    with served_gateway(settings) as url:
        yield url


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Where the run leaves screenshots of the console for a person to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
