"""The console's push subscriptions in a real browser: a subscription made through the API
delivers to a small HTTP application (tests/push_app.py), the view shows its deliveries, and
pausing and resuming from the view stop and restart them.

Here a console error or a failed request fails the test too, not only a JavaScript error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Locator, Page, expect

from app.nats.embedded import EmbeddedServer
from tests.browser.support import settled
from tests.helpers import gateway_settings, served_gateway
from tests.push_app import Answer, PushApp, Received

pytestmark = pytest.mark.server("2.11")  # the consumer's pause


def refuses_bad_orders(request: Received) -> Answer:
    """204 to each POST, 422 to a body that starts with ``bad``."""
    return Answer(422) if request.body.startswith(b"bad") else Answer(204)


@pytest.fixture
async def application() -> AsyncIterator[PushApp]:
    async with PushApp(refuses_bad_orders) as app:
        yield app


@pytest.fixture
def push_url(nats_server: EmbeddedServer, name: str) -> Iterator[str]:
    """A served gateway whose subscriptions are stored in a bucket of this test alone (ask for
    it before ``page``, as for ``base_url``)."""
    settings = gateway_settings(nats_server.url, subscriptions_bucket=f"subs_{name}")
    with served_gateway(settings) as url:
        yield url


async def publish(http: httpx.AsyncClient, subject: str, bodies: list[bytes]) -> None:
    for body in bodies:
        sent = await http.post(f"/v1/publish/{subject}", content=body)
        assert sent.status_code == 200, sent.text


async def test_subscriptions_view_shows_deliveries_and_pauses(
    push_url: str, application: PushApp, strict_page: Page, name: str, screenshots: Path
) -> None:
    page = strict_page
    subject = name.lower()
    async with httpx.AsyncClient(base_url=push_url, timeout=10) as http:
        made = await http.put(f"/v1/streams/{name}", json={"subjects": [f"{subject}.>"]})
        assert made.status_code == 201, made.text
        body = {
            "stream": name,
            "consumer": "orders-app",
            "endpoint": application.url,
            "consumer_config": {"filter_subject": f"{subject}.orders", "max_deliver": 3},
            "dead_letter": {"subject": f"{subject}.dlq"},
        }
        made = await http.put(f"/v1/subscriptions/{name}", json=body)
        assert made.status_code == 201, made.text
        await publish(http, f"{subject}.orders", [b'{"n": %d}' % i for i in range(10)])
        await publish(http, f"{subject}.orders", [b"bad order 1", b"bad order 2"])

        await page.goto(f"{push_url}/ui/#/")
        await page.get_by_role("link", name="Subscriptions and their state →").click()
        row = page.locator(f'#subscriptions tr[data-name="{name}"]')

        def cell(field: str) -> Locator:
            return row.locator(f'[data-field="{field}"]')

        await expect(cell("acked")).to_have_text("10")
        await expect(cell("dead_lettered")).to_have_text("2")
        await expect(cell("delivered")).to_have_text("12")
        await expect(cell("terminated")).to_have_text("2")
        await expect(cell("in_flight")).to_have_text("0")
        await expect(cell("num_pending")).to_have_text("0")
        await expect(cell("state")).to_have_text("running")
        await expect(cell("last_error")).to_contain_text("HTTP 422")
        await expect(row).to_contain_text(f"{name}/orders-app")
        await expect(row).to_contain_text(application.url)
        assert len(application.ok) == 10
        await page.screenshot(path=screenshots / "console-subscriptions.png", full_page=True)

        # Paused from the view: the consumer's pause, so nothing more reaches the application.
        await row.get_by_role("button", name="Pause").click()
        await expect(page.locator("#flash")).to_contain_text(f"Paused {name}")
        await settled(page)
        await expect(cell("state")).to_have_text("paused")
        await expect(row.get_by_role("button", name="Pause")).to_have_count(0)
        info = (await http.get(f"/v1/streams/{name}/consumers/orders-app")).json()
        assert info["paused"] is True
        await publish(http, f"{subject}.orders", [b'{"n": %d}' % i for i in range(10, 15)])
        await expect(cell("num_pending")).to_have_text("5")  # the view refreshes by itself
        assert len(application.ok) == 10

        await row.get_by_role("button", name="Resume").click()
        await expect(page.locator("#flash")).to_contain_text(f"Resumed {name}")
        await settled(page)
        await expect(cell("acked")).to_have_text("15")
        await expect(cell("num_pending")).to_have_text("0")
        await expect(cell("state")).to_have_text("running")
        assert len(application.ok) == 15

        # The subscription's own page: its figures and config.
        await row.get_by_role("link", name=name, exact=True).click()
        await expect(page.locator(".stat", has_text="acked")).to_contain_text("15")
        await expect(page.locator("pre.value")).to_contain_text(application.url)
        await page.screenshot(path=screenshots / "console-subscription.png", full_page=True)
