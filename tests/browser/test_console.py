"""The web console at /ui in a real browser: live watches, browsing, writes, auth.

Each test leaves screenshots in test-artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import KeyNotFoundError
from playwright.async_api import Page, expect

from app.nats.embedded import EmbeddedServer
from tests.browser.support import create_bucket, settled
from tests.helpers import gateway_settings, served_gateway

TOKEN = "console-admin-token-0123456789"
READER = "console-viewer-token-0123456789"
POLICY = f"""
tokens:
  - name: operator
    token: "{TOKEN}"
    rules:
      - {{resource: "kv:*", actions: [read, write, admin]}}
      - {{resource: "stream:*", actions: [read, write, admin]}}
      - {{resource: "consumer:*/*", actions: [consume, admin]}}
  - name: viewer
    token: "{READER}"
    rules:
      - {{resource: "kv:*", actions: [read]}}
      - {{resource: "stream:*", actions: [read]}}
"""


@pytest.fixture
def auth_url(nats_server: EmbeddedServer, tmp_path: Path) -> Iterator[str]:
    """A gateway with auth on: one token, allowed everything."""
    path = tmp_path / "auth.yaml"
    path.write_text(POLICY)
    settings = gateway_settings(nats_server.url, auth_file=path, kv_watch_heartbeat=0.5)
    with served_gateway(settings) as url:
        yield url


async def test_watch_view_shows_a_nats_py_write_within_a_second(
    base_url: str, page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    await create_bucket(base_url, name, history=5)
    kv = await nc.jetstream().key_value(name)
    for key, value in [("sensor.1", b"20.5"), ("sensor.2", b"19.0"), ("door", b"closed")]:
        await kv.put(key, value)

    await page.goto(f"{base_url}/ui/#/kv/{name}/watch")
    await expect(page.locator("#watch-status")).to_have_class(re.compile(r"\blive\b"))
    await expect(page.locator("#events tr")).to_have_count(3)

    started = time.monotonic()
    revision = await kv.put("sensor.1", b"21.5")
    row = page.locator(f'#events tr[data-rev="{revision}"]')
    await row.wait_for(timeout=1000)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"the write showed after {elapsed:.2f}s"
    await expect(row).to_contain_text("sensor.1")
    await expect(row).to_contain_text("21.5")
    await expect(row.locator("td").first).to_have_text(str(revision))
    # The newest event is on top.
    await expect(page.locator("#events tr").first).to_have_attribute("data-rev", str(revision))

    await kv.delete("door")
    await kv.put("sensor.2", b"19.5")
    await expect(page.locator("#events tr")).to_have_count(6)
    await expect(page.locator("#events tr").nth(1)).to_contain_text("delete")
    await page.screenshot(path=screenshots / "console-watch.png", full_page=True)


async def test_writes_check_revisions(
    base_url: str, page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    """An update or delete goes only over the revision on screen; a create only over no value."""
    await create_bucket(base_url, name, history=5)
    kv = await nc.jetstream().key_value(name)
    await kv.put("config.mode", b"blue")
    await kv.put("config.size", b"10")
    flash = page.locator("#flash")

    await page.goto(f"{base_url}/ui/#/kv/{name}/keys/config.mode")
    await expect(page.locator("pre.value")).to_have_text("blue")
    # Someone else writes in between: the console's update is refused, not lost.
    moved_on = await kv.put("config.mode", b"green")
    await page.fill("textarea[name=value]", "red")
    await page.get_by_role("button", name="Save").click()
    await expect(flash).to_contain_text("kv.revision_mismatch")
    await expect(flash).to_contain_text(f"revision {moved_on}")
    assert (await kv.get("config.mode")).value == b"green"
    await page.screenshot(path=screenshots / "console-conflict.png", full_page=True)

    await page.get_by_role("button", name="Reload").click()
    await expect(page.locator("pre.value")).to_have_text("green")
    await page.fill("textarea[name=value]", "red")
    await page.get_by_role("button", name="Save").click()
    await expect(flash).to_contain_text(f"Stored at revision {moved_on + 1}")
    await expect(page.locator("pre.value")).to_have_text("red")
    entry = await kv.get("config.mode")
    assert (entry.value, entry.revision) == (b"red", moved_on + 1)

    await page.get_by_role("button", name="Delete").click()
    await expect(flash).to_contain_text("Deleted config.mode")
    with pytest.raises(KeyNotFoundError):
        await kv.get("config.mode")
    await expect(page.get_by_text(f"No value: DEL at revision {moved_on + 2}")).to_be_visible()

    # "Create only" refuses a key that has a value; unticked, it writes over it.
    await page.goto(f"{base_url}/ui/#/kv/{name}")
    await page.fill("input[name=key]", "config.size")
    await page.fill("textarea[name=value]", "20")
    await page.get_by_role("button", name="Put").click()
    await expect(flash).to_contain_text("kv.key_exists")
    assert (await kv.get("config.size")).value == b"10"
    await page.uncheck("input[name=create]")
    await page.get_by_role("button", name="Put").click()
    await expect(flash).to_contain_text("Stored config.size at revision")
    assert (await kv.get("config.size")).value == b"20"


async def test_bucket_view_shows_mirrors_and_an_aggregates_origins(
    base_url: str, page: Page, name: str, screenshots: Path
) -> None:
    origin, agg = f"{name}_O", f"{name}_AGG"
    await create_bucket(base_url, origin)
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        made = await http.put(f"/v1/kv/{origin}/mirrors/{name}_NYC", json={})
        assert made.status_code == 201, made.text
        aggregate = {"aggregate": {"origins": [{"bucket": origin, "keys": ["eu.>"]}]}}
        assert (await http.put(f"/v1/kv/{agg}", json=aggregate)).status_code == 201

    await page.goto(f"{base_url}/ui/#/kv/{origin}")
    mirror = page.locator("tr.mirror")
    await expect(mirror).to_have_count(1)
    await expect(mirror).to_contain_text(f"{name}_NYC")
    await expect(mirror).to_contain_text("all keys")
    await expect(page.get_by_role("button", name="Put")).to_be_visible()

    await page.goto(f"{base_url}/ui/#/kv/{agg}")
    await expect(page.get_by_text("Aggregate (read-only)")).to_be_visible()
    await expect(page.locator("tr.origin")).to_contain_text(f"KV_{origin}")
    await expect(page.locator("tr.origin")).to_contain_text("eu.>")
    await expect(page.get_by_role("button", name="Put")).to_have_count(0)
    await page.screenshot(path=screenshots / "console-aggregate.png", full_page=True)


async def test_console_with_auth(
    auth_url: str, page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    """Token entered once; buckets, keys with paging, an entry with history, a stream's last
    messages and a consumer's pinned client; the watch runs on a short-lived SSE token."""
    stream = f"{name}_ORDERS"
    subject = stream.lower()
    await setup_data(auth_url, nc, name, stream, subject)
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))

    await page.goto(f"{auth_url}/ui/")
    await expect(page.get_by_text("This gateway needs a token")).to_be_visible()
    await page.screenshot(path=screenshots / "console-login.png")
    await page.fill("input[name=token]", TOKEN)
    await page.click("button[type=submit]")
    await expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
    await expect(page.get_by_role("link", name=stream, exact=True)).to_be_visible()
    await page.screenshot(path=screenshots / "console-overview.png", full_page=True)

    # Keys, 50 a page: 61 keys make two pages.
    await page.get_by_role("link", name=name, exact=True).click()
    keys = page.locator("ul.keys li")
    await expect(keys).to_have_count(50)
    await page.screenshot(path=screenshots / "console-bucket.png", full_page=True)
    await page.get_by_role("button", name="Next →").click()
    await expect(keys).to_have_count(11)
    await expect(page.get_by_role("button", name="Next →")).to_be_disabled()
    await page.get_by_role("button", name="← Previous").click()
    await expect(keys).to_have_count(50)

    # An entry and its history, newest first.
    await page.goto(f"{auth_url}/ui/#/kv/{name}/keys/user.0001.name")
    await expect(page.locator("pre.value")).to_have_text("Robert")
    history = page.locator(".card", has_text="History").locator("tbody tr")
    await expect(history).to_have_count(3)
    await expect(history.first).to_contain_text("Robert")
    await expect(history.last).to_contain_text("Bob")
    await page.screenshot(path=screenshots / "console-key.png", full_page=True)

    # The stream's last ten messages, newest on top, and its consumer's pinned client.
    await page.goto(f"{auth_url}/ui/#/streams/{stream}")
    messages = page.locator("#messages tbody tr")
    await expect(messages).to_have_count(10)
    await expect(messages.first).to_have_attribute("data-seq", "30")
    await expect(messages.last).to_have_attribute("data-seq", "21")
    consumers = page.locator(".card", has_text="Consumers").locator("tbody tr")
    await expect(consumers).to_have_count(1)
    pin = await pin_of(auth_url, stream)
    await expect(consumers.first).to_contain_text(f"jobs: {pin}")
    await page.screenshot(path=screenshots / "console-stream.png", full_page=True)

    await page.get_by_role("link", name="workers").click()
    group = page.locator('tr[data-group="jobs"]')
    await expect(group).to_contain_text(pin)
    await expect(group.locator(".age")).to_have_text(re.compile(r"^ \((\d+s|\d+m \d+s) ago\)$"))
    await expect(page.locator(".stat", has_text="ack pending")).to_contain_text("5")
    await page.screenshot(path=screenshots / "console-consumer.png", full_page=True)

    # The token was entered once: a reload keeps it (sessionStorage), and a live watch works.
    await page.goto(f"{auth_url}/ui/#/kv/{name}/watch?key=user.0001.*")
    await page.reload()
    await expect(page.locator("#watch-status")).to_have_class(re.compile(r"\blive\b"))
    kv = await nc.jetstream().key_value(name)
    revision = await kv.put("user.0001.name", b"Rob")
    await expect(page.locator(f'#events tr[data-rev="{revision}"]')).to_contain_text("Rob")

    watch_urls = [u for u in urls if f"/v1/kv/{name}/watch" in u]
    assert watch_urls and all("access_token=" in u for u in watch_urls), watch_urls
    assert not [u for u in urls if TOKEN in u], "the bearer token never goes into a URL"


async def setup_data(url: str, nc: nats.NATS, bucket: str, stream: str, subject: str) -> None:
    """60 keys (one with three revisions), a stream of 30 messages, a pinned consumer."""
    await create_bucket(url, bucket, token=TOKEN, history=5)
    kv = await nc.jetstream().key_value(bucket)
    for i in range(60):
        await kv.put(f"user.{i:04}.email", f"user{i}@example.com".encode())
    for value in (b"Bob", b"Bobby", b"Robert"):
        await kv.put("user.0001.name", value)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as http:
        created = await http.put(
            f"/v1/streams/{stream}", json={"subjects": [f"{subject}.>"], "allow_direct": True}
        )
        assert created.status_code == 201, created.text
        for i in range(1, 31):
            region = ("eu", "us")[i % 2]
            sent = await http.post(
                f"/v1/publish/{subject}.{region}.{i}",
                content=f'{{"order": {i}, "total": {i * 7}.50}}'.encode(),
                headers={"Nats-Header-Tenant": "acme"},
            )
            assert sent.status_code == 200, sent.text
        consumer = await http.put(
            f"/v1/streams/{stream}/consumers/workers",
            json={
                "priority_groups": ["jobs"],
                "priority_policy": "pinned_client",
                "priority_timeout": "1m",
            },
        )
        assert consumer.status_code == 201, consumer.text
        fetched = await http.post(
            f"/v1/streams/{stream}/consumers/workers/fetch",
            json={"group": "jobs", "max_messages": 5, "expires": 1},
        )
        assert fetched.status_code == 200 and fetched.json()["pin_id"], fetched.text


async def pin_of(url: str, stream: str) -> str:
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as http:
        info = (await http.get(f"/v1/streams/{stream}/consumers/workers")).json()
    return info["priority_groups"][0]["pinned_client_id"]


@pytest.mark.server("2.12")
async def test_counters_and_pausing(
    base_url: str, page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    """A counting stream shows its counters' values; a consumer is paused and resumed."""
    low = name.lower()
    async with httpx.AsyncClient(base_url=base_url) as http:
        config = {"subjects": [f"{low}.>"], "allow_msg_counter": True, "allow_direct": True}
        assert (await http.put(f"/v1/streams/{name}", json=config)).status_code == 201
        for subject, increment in ((f"{low}.home", "40"), (f"{low}.home", 2), (f"{low}.big", BIG)):
            sent = await http.post(f"/v1/counters/{name}/{subject}", json={"increment": increment})
            assert sent.status_code == 200, sent.text
        assert (await http.put(f"/v1/streams/{name}/consumers/audit", json={})).is_success

    await page.goto(f"{base_url}/ui/#/streams/{name}")
    await expect(page.locator(f'#counters tr[data-subject="{low}.home"]')).to_contain_text("42")
    await expect(page.locator(f'#counters tr[data-subject="{low}.big"]')).to_contain_text(BIG)
    await page.screenshot(path=screenshots / "console-counters.png", full_page=True)

    await page.get_by_role("link", name="audit").click()
    pause = page.locator("#pause")
    await expect(pause).to_contain_text("Delivering")
    await page.fill("input[name=until]", "2h")
    await pause.get_by_role("button", name="Pause").click()
    await expect(page.locator("#flash")).to_contain_text("Paused until")
    await settled(page)
    await expect(pause).to_contain_text("Paused:")
    info = await nc.jetstream().consumer_info(name, "audit")
    assert info.config.pause_until is not None
    await pause.get_by_role("button", name="Resume").click()
    await expect(page.locator("#flash")).to_contain_text("Resumed")
    await settled(page)
    await expect(pause).to_contain_text("Delivering")


BIG = "98765432109876543210987654321"


async def test_a_token_that_may_only_read_sees_each_refusal_plainly(
    auth_url: str, page: Page, nc: nats.NATS, name: str
) -> None:
    """With a read-only token the console browses, and every write it tries (a value, a
    bucket's config) is answered 403 on the page as the gateway wrote it; nothing changes,
    and the page does not fall back to the login (that is for 401). (Chromium logs each 4xx
    answer as a console error: this page cannot be the strict one.)"""
    await create_bucket(auth_url, name, token=TOKEN)
    await page.goto(f"{auth_url}/ui/")
    await page.fill("input[name=token]", READER)
    await page.click("button[type=submit]")
    await expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()

    await page.goto(f"{auth_url}/ui/#/kv/{name}")
    await page.locator("input[name=key]").fill("a")
    await page.locator("textarea[name=value]").fill("1")
    await page.get_by_role("button", name="Put").click()
    await expect(page.locator("#flash")).to_contain_text("403 Forbidden")
    await expect(page.locator("#flash")).to_contain_text("(auth.forbidden)")
    await settled(page)
    edit = page.locator("#edit-bucket")
    await edit.locator("[name=history]").fill("9")
    await edit.get_by_role("button", name="Save changes").click()
    await expect(edit.locator(".problem")).to_contain_text("403 Forbidden")
    await expect(page.locator("#new-bucket-name, input[name=token]")).to_have_count(0)
    status = await (await nc.jetstream().key_value(name)).status()
    assert (status.values, status.history) == (0, 1)
