"""The console's administration and message views in a real browser: streams created, edited,
purged and deleted from forms built from the OpenAPI document; messages paged, read (text,
JSON, hex) and published with headers; consumers created, fetched from, settled and deleted.

Each check reads the result back through nats-py, not through the page. Screenshots go to
test-artifacts/screenshots/.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import NotFoundError
from playwright.async_api import Page, expect

from tests.browser.support import axe_violations, settled


async def test_a_stream_from_create_to_delete(
    base_url: str, strict_page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    page = strict_page
    js = nc.jetstream()
    await page.goto(f"{base_url}/ui/")
    await page.locator("#new-stream summary").click()
    form = page.locator("#create-stream")
    await form.locator("[name=name]").fill(name)
    await form.locator("[name=subjects]").fill(f"{name}.>")
    await form.locator("[name=storage]").select_option("memory")
    await form.locator("[name=max_age]").fill("1h")
    await form.locator("[name=allow_direct]").check()
    await page.screenshot(path=screenshots / "admin-create-stream.png", full_page=True)
    await form.get_by_role("button", name="Create stream").click()
    await expect(page).to_have_url(f"{base_url}/ui/#/streams/{name}")
    info = await js.stream_info(name)
    assert info.config.storage == "memory"
    assert info.config.max_age == 3600.0 and info.config.allow_direct is True

    # Publish with headers from the page; the message view shows them and the payload.
    await page.locator("#pub-subject").fill(f"{name}.orders")
    await page.locator("#pub-headers").fill("X-Trace: t-1\nNats-Msg-Id: first")
    await page.locator("#pub-payload").fill('{"id": 7, "items": ["a", "b"]}')
    await page.get_by_role("button", name="Publish").click()
    await expect(page.locator("#publish")).to_contain_text("Stored as seq 1")
    stored = await js.get_msg(name, 1)
    assert stored.headers == {"X-Trace": "t-1", "Nats-Msg-Id": "first"}
    assert json.loads(stored.data) == {"id": 7, "items": ["a", "b"]}
    for i in range(2, 31):
        await js.publish(
            f"{name}.{'odd' if i % 2 else 'even'}", b"\x00\xff" if i == 30 else b"m%d" % i
        )

    # Paging: the latest page, then older ones, then a subject filter.
    await page.locator("#msg-size").select_option("10")
    await page.get_by_role("button", name="Latest").click()
    rows = page.locator("#messages tbody tr")
    await expect(rows).to_have_count(10)
    await expect(rows.first).to_have_attribute("data-seq", "30")  # newest on top
    await expect(rows.last).to_have_attribute("data-seq", "21")
    await page.get_by_role("button", name="← Older").click()
    await expect(rows.first).to_have_attribute("data-seq", "20")
    await page.locator("#msg-start").fill("1")
    await page.locator("#msg-filter").fill(f"{name}.even")
    await page.get_by_role("button", name="Show").click()
    await expect(rows).to_have_count(5)  # 10, 8, 6, 4, 2
    await expect(rows.last).to_have_attribute("data-seq", "2")
    await page.screenshot(path=screenshots / "admin-stream-messages.png", full_page=True)

    # One message: its headers and its payload as JSON, text and hex.
    await page.goto(f"{base_url}/ui/#/streams/{name}/messages/1")
    await expect(page.locator("#payload")).to_have_attribute("data-view", "json")
    await expect(page.locator("#payload")).to_contain_text('"items": [\n    "a",')
    await expect(page.locator("main")).to_contain_text("X-Trace")
    await page.get_by_role("button", name="hex").click()
    await expect(page.locator("#payload")).to_contain_text("7b 22 69 64 22")
    await page.screenshot(path=screenshots / "admin-message.png", full_page=True)
    await page.goto(f"{base_url}/ui/#/streams/{name}/messages/30")
    await expect(page.locator("#payload")).to_have_attribute("data-view", "hex")
    await expect(page.get_by_role("button", name="JSON")).to_be_disabled()
    await expect(page.locator("#payload")).to_contain_text("00 ff")

    # A consumer: created from its form, a fetch from the page, acked and termed there.
    await page.goto(f"{base_url}/ui/#/streams/{name}")
    await page.locator("#new-consumer summary").click()
    consumer = page.locator("#create-consumer")
    await consumer.locator("[name=durable_name]").fill("worker")
    await consumer.locator("[name=filter_subject]").fill(f"{name}.odd")
    await consumer.locator("[name=ack_wait]").fill("30s")
    await consumer.get_by_role("button", name="Create consumer").click()
    await expect(page).to_have_url(f"{base_url}/ui/#/streams/{name}/consumers/worker")
    assert (await js.consumer_info(name, "worker")).config.filter_subject == f"{name}.odd"
    await page.locator("#fetch-count").fill("2")
    await page.get_by_role("button", name="Fetch").click()
    fetched = page.locator("#fetched tbody tr")
    await expect(fetched).to_have_count(2)
    await fetched.nth(0).get_by_role("button", name="ack").click()
    await fetched.nth(1).get_by_role("button", name="term").click()
    await expect(fetched.nth(0).locator(".outcome")).to_have_text("ack ✓")
    await expect(fetched.nth(1).locator(".outcome")).to_have_text("term ✓")
    await page.screenshot(path=screenshots / "admin-consumer-fetch.png", full_page=True)
    state = await js.consumer_info(name, "worker")
    assert (state.num_ack_pending, state.delivered.stream_seq) == (0, 5)

    # Edit the stream: a limit changed from the form.
    await page.goto(f"{base_url}/ui/#/streams/{name}")
    await page.locator("#edit-stream [name=max_msgs]").fill("1000")
    await page.get_by_role("button", name="Save changes").click()
    await expect(page.locator("#flash")).to_contain_text(f"Stream {name} updated.")
    await settled(page)
    assert (await js.stream_info(name)).config.max_msgs == 1000

    # Purge one subject, then everything, each confirmed by typing the name.
    await page.locator("#purge-filter").fill(f"{name}.even")
    await page.get_by_role("button", name="Purge…").click()
    purge = page.get_by_role("button", name="Purge", exact=True)
    await expect(purge).to_be_disabled()
    await page.get_by_label(f"type {name} to confirm").first.fill(name)
    await purge.click()
    await expect(page.locator("#flash")).to_contain_text("Purged 15 messages.")
    await settled(page)
    assert (await js.stream_info(name)).state.messages == 15

    await page.get_by_role("button", name="Delete stream…").click()
    await page.get_by_label(f"type {name} to confirm").last.fill(name)
    await page.get_by_role("button", name="Delete stream", exact=True).click()
    await expect(page).to_have_url(f"{base_url}/ui/#/")
    with pytest.raises(NotFoundError):
        await js.stream_info(name)


async def test_refusals_are_shown_as_the_gateway_wrote_them(
    base_url: str, page: Page, nc: nats.NATS, name: str
) -> None:
    """A stream the server refuses (subjects overlapping another's) and a subject no stream
    stores: the problem's status, title and code on the page, nothing created."""
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await page.goto(f"{base_url}/ui/")
    await page.locator("#new-stream summary").click()
    form = page.locator("#create-stream")
    await form.locator("[name=name]").fill(f"{name}_2")
    await form.locator("[name=subjects]").fill(f"{name}.a")
    await form.get_by_role("button", name="Create stream").click()
    await expect(form.locator(".problem")).to_contain_text(
        "409 Conflict: subjects overlap with an existing stream (stream.subject_overlap)"
    )
    with pytest.raises(NotFoundError):
        await js.stream_info(f"{name}_2")
    # A subject the schema's pattern refuses never leaves the page.
    await form.locator("[name=subjects]").fill("a..b")
    await form.get_by_role("button", name="Create stream").click()
    assert await form.locator("[name=subjects]").evaluate("e => e.validationMessage")

    await page.goto(f"{base_url}/ui/#/streams/{name}")
    await page.locator("#pub-subject").fill("elsewhere.x")
    await page.get_by_role("button", name="Publish").click()
    await expect(page.locator("#publish .problem")).to_contain_text("no stream")


# The cells of a table row whose content runs past the next cell's start.
OVERLAPPING_CELLS = """() => {
  const found = [];
  for (const row of document.querySelectorAll("main tr")) {
    const cells = [...row.children];
    for (let i = 0; i + 1 < cells.length; i++) {
      const a = cells[i], b = cells[i + 1];
      const right = a.getBoundingClientRect().left + a.scrollWidth;
      if (right > b.getBoundingClientRect().left + 1) found.push(a.textContent.slice(0, 40));
    }
  }
  return found.slice(0, 5);
}"""


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)], ids=["desktop", "phone"])
async def test_the_admin_views_pass_axe(
    base_url: str,
    page: Page,
    nc: nats.NATS,
    name: str,
    screenshots: Path,
    width: int,
    height: int,
) -> None:
    """axe-core finds nothing serious or critical on the console's views, at desktop and
    phone sizes."""
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.publish(f"{name}.a", b'{"x": 1}', headers={"X-A": "1"})
    await js.add_consumer(name, durable_name="c1")
    kv = await js.create_key_value(bucket=name, history=3)
    await kv.put("k.1", b"v1")
    await kv.put("k.1", b"v2")
    async with httpx.AsyncClient(base_url=base_url) as http:
        aggregate = {"aggregate": {"origins": [{"bucket": name}]}}
        assert (await http.put(f"/v1/kv/{name}_all", json=aggregate)).status_code == 201
    await page.set_viewport_size({"width": width, "height": height})
    for where, hash_, shown in [
        ("overview", "#/", "#new-stream"),
        ("stream", f"#/streams/{name}", "#messages tbody tr"),
        ("message", f"#/streams/{name}/messages/1", "#payload"),
        ("consumer", f"#/streams/{name}/consumers/c1", "#fetched"),
        ("health", "#/health", "#health .card"),
        ("bucket", f"#/kv/{name}", "ul.keys li"),
        ("aggregate", f"#/kv/{name}_all", "tr.origin"),
        ("key", f"#/kv/{name}/keys/k.1", "pre.value"),
        ("watch", f"#/kv/{name}/watch", "#events tr"),
        ("subscriptions", "#/subscriptions", "main .card"),
        ("objects", "#/obj", "main .card"),
    ]:
        await page.goto(f"{base_url}/ui/{hash_}")
        await expect(page.locator(shown).first).to_be_attached()
        await page.wait_for_load_state("networkidle")
        for details in await page.locator("main details").all():
            await details.locator("summary").click()  # (the forms inside are checked too)
        await page.screenshot(path=screenshots / f"axe-{where}-{width}.png", full_page=True)
        found = await axe_violations(page)
        assert not found, (where, found)
        await expect(page.locator("main h1")).to_have_count(1)  # (axe: page-has-heading-one)
        # Nothing wider than the screen: the page never scrolls sideways.
        overflow = "document.documentElement.scrollWidth - window.innerWidth"
        assert await page.evaluate(overflow) <= 0, where
        # No table cell drawn over the next one (a table wider than the screen scrolls).
        overlaps = await page.evaluate(OVERLAPPING_CELLS)
        assert not overlaps, (where, overlaps)


async def test_health_shows_the_gateway_nats_and_the_pool(
    base_url: str, strict_page: Page, screenshots: Path
) -> None:
    page = strict_page
    async with httpx.AsyncClient(base_url=base_url) as http:
        info = (await http.get("/v1/info")).json()
    await page.goto(f"{base_url}/ui/#/health")
    health = page.locator("#health")
    await expect(health.locator(".stat", has_text="ready")).to_contain_text("yes")
    await expect(health.locator(".stat", has_text="version").nth(1)).to_contain_text(
        info["server"]["version"]
    )
    await expect(
        health.locator(".card", has_text="Connection pool").locator("tbody tr")
    ).to_have_count(info["pool"]["size"])
    # Rates come from two readings of /metrics, 2 s apart: this page's own requests count.
    await expect(health.locator(".stat", has_text="requests").first).to_contain_text(
        re.compile(r"^requests[0-9.]+/s$")
    )
    await expect(health.locator(".stat", has_text="5xx answers")).to_contain_text("0.0/s")
    await page.screenshot(path=screenshots / "admin-health.png", full_page=True)


async def test_a_bucket_from_create_to_delete(
    base_url: str, strict_page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    """A bucket made from its form (the KVConfig schema), a value put with a per-key TTL, and
    the bucket deleted once its name is typed."""
    page = strict_page
    await page.goto(f"{base_url}/ui/")
    await page.locator("#new-bucket summary").click()
    await page.locator("#new-bucket-name").fill(name)
    form = page.locator("#create-bucket")
    await form.locator("[name=history]").fill("5")
    await form.locator("[name=limit_marker_ttl]").fill("1s")
    await page.screenshot(path=screenshots / "admin-create-bucket.png", full_page=True)
    await form.get_by_role("button", name="Create bucket").click()
    await expect(page).to_have_url(f"{base_url}/ui/#/kv/{name}")
    status = await (await nc.jetstream().key_value(name)).status()
    assert status.history == 5

    await page.locator("input[name=key]").fill("session.1")
    await page.locator("textarea[name=value]").fill("token")
    await page.get_by_label("per-key TTL").fill("1h")
    await page.get_by_role("button", name="Put").click()
    await expect(page.locator("#flash")).to_contain_text("Stored session.1 at revision 1")
    await settled(page)
    stored = await nc.jetstream().get_last_msg(f"KV_{name}", f"$KV.{name}.session.1")
    assert stored.headers is not None and stored.headers.get("Nats-TTL") == "3600s"

    await page.get_by_role("button", name="Delete bucket…").click()
    await page.get_by_label(f"type {name} to confirm").fill(name)
    await page.get_by_role("button", name="Delete bucket", exact=True).click()
    await expect(page).to_have_url(f"{base_url}/ui/#/")
    with pytest.raises(NotFoundError):
        await nc.jetstream().stream_info(f"KV_{name}")


async def test_messages_from_a_time(
    base_url: str, strict_page: Page, nc: nats.NATS, name: str
) -> None:
    """On a stream with Direct Get, the pager starts at the first message at or after a time
    given in the page's local time."""
    page = strict_page
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=True)
    for i in range(5):
        await js.publish(f"{name}.early", b"e%d" % i)
    await asyncio.sleep(1.2)
    later = await js.publish(f"{name}.late", b"late")
    stored = await js.get_msg(name, later.seq)
    assert stored.time is not None
    await page.goto(f"{base_url}/ui/#/streams/{name}")
    await expect(page.locator("#messages tbody tr").first).to_be_attached()
    # The stored time, to the second, as the page's local time (datetime-local's format).
    await page.locator("#msg-time").evaluate(
        """(input, ms) => {
            const d = new Date(Math.floor(ms / 1000) * 1000);
            const p = (n) => String(n).padStart(2, "0");
            input.value = `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}` +
                `T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
        }""",
        stored.time.timestamp() * 1000,
    )
    await page.get_by_role("button", name="Go to time").click()
    rows = page.locator("#messages tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-seq", str(later.seq))


async def test_a_bucket_edited_mirrored_and_aggregated(
    base_url: str, strict_page: Page, nc: nats.NATS, name: str, screenshots: Path
) -> None:
    """A bucket's config edited from its form (what the form does not show, its memory
    storage, stays), a mirror added and deleted, and an aggregate made of it from the
    create form, then given a second origin: each read back through nats-py."""
    page = strict_page
    js = nc.jetstream()
    await js.create_key_value(KeyValueConfig(bucket=name, storage=StorageType.MEMORY, direct=True))
    await page.goto(f"{base_url}/ui/#/kv/{name}")
    edit = page.locator("#edit-bucket")
    await expect(edit.locator("[name=history]")).to_have_value("1")
    await edit.locator("[name=history]").fill("5")
    await edit.locator("[name=description]").fill("sessions")
    await edit.get_by_role("button", name="Save changes").click()
    await expect(page.locator("#flash")).to_contain_text(f"Bucket {name} updated.")
    await settled(page)
    config = (await js.stream_info(f"KV_{name}")).config
    assert (config.max_msgs_per_subject, config.description) == (5, "sessions")
    assert config.storage == StorageType.MEMORY
    # (The view is drawn again after a save: its new form, not the old one, is filled.)
    await expect(page.locator(".stat", has_text="history")).to_contain_text("5")
    # An emptied field goes back to its default: the description is removed.
    await edit.locator("[name=description]").fill("")
    await page.locator("#flash button").click()
    await edit.get_by_role("button", name="Save changes").click()
    await expect(page.locator("#flash")).to_be_visible()
    await expect(page.locator("#flash")).to_contain_text(f"Bucket {name} updated.")
    await settled(page)
    config = (await js.stream_info(f"KV_{name}")).config
    assert (config.max_msgs_per_subject, config.description) == (5, None)

    # A mirror: made from its form, listed, deleted once its name is typed.
    mirror = f"{name}_m"
    await page.locator("#new-mirror summary").click()
    await page.locator("#new-mirror-name").fill(mirror)
    await page.locator("#add-mirror [name=storage]").select_option("memory")
    await page.locator("#add-mirror [name=description]").fill("replica")
    await page.get_by_role("button", name="Save mirror").click()
    await expect(page.locator("#flash")).to_contain_text(f"Mirror {mirror} of {name} saved.")
    await settled(page)
    row = page.locator(f"tr.mirror[data-mirror={mirror}]")
    await expect(row).to_be_visible()
    info = await js.stream_info(mirror)
    assert info.config.mirror is not None and info.config.mirror.name == f"KV_{name}"
    # The same name again changes it; what the form leaves empty keeps its value.
    await page.locator("#new-mirror summary").click()
    await page.locator("#new-mirror-name").fill(mirror)
    await page.locator("#add-mirror [name=max_bytes]").fill("1048576")
    await page.locator("#flash button").click()  # (the first save's message, closed)
    await page.get_by_role("button", name="Save mirror").click()
    await expect(page.locator("#flash")).to_be_visible()
    await expect(page.locator("#flash")).to_contain_text(f"Mirror {mirror} of {name} saved.")
    await settled(page)
    changed = (await js.stream_info(mirror)).config
    assert changed.max_bytes == 1048576
    assert (changed.storage, changed.description) == (StorageType.MEMORY, "replica")
    await page.screenshot(path=screenshots / "admin-bucket-topology.png", full_page=True)
    await row.get_by_role("button", name="Delete mirror…").click()
    await row.get_by_label(f"type {mirror} to confirm").fill(mirror)
    await row.get_by_role("button", name="Delete mirror", exact=True).click()
    await expect(page.locator("#flash")).to_contain_text(f"Mirror {mirror} deleted.")
    await settled(page)
    await expect(page.locator(f"tr.mirror[data-mirror={mirror}]")).to_have_count(0)
    with pytest.raises(NotFoundError):
        await js.stream_info(mirror)

    # An aggregate of the bucket's orders.> keys, then a second origin.
    union, other = f"{name}_all", f"{name}_b"
    await js.create_key_value(KeyValueConfig(bucket=other, direct=True))
    await page.goto(f"{base_url}/ui/")
    await page.locator("#new-bucket summary").click()
    await page.locator("#new-bucket-name").fill(union)
    await page.locator("#aggregate-origins").fill(name)
    await page.locator("#aggregate-keys").fill("orders.>")
    await page.get_by_role("button", name="Create bucket").click()
    await expect(page).to_have_url(f"{base_url}/ui/#/kv/{union}")
    await expect(page.locator("main")).to_contain_text("Aggregate (read-only)")
    sources = (await js.stream_info(f"KV_{union}")).config.sources or []
    assert [s.name for s in sources] == [f"KV_{name}"]
    await page.locator("#new-origin summary").click()
    await page.locator("#add-origin [name=bucket]").fill(other)
    await page.get_by_role("button", name="Add origin").click()
    await expect(page.locator("#flash")).to_contain_text(f"{union} now copies {other}.")
    await settled(page)
    await expect(page.locator("tr.origin")).to_have_count(2)
    sources = (await js.stream_info(f"KV_{union}")).config.sources or []
    assert sorted(s.name for s in sources) == sorted([f"KV_{name}", f"KV_{other}"])


async def test_a_consumer_edited(
    base_url: str, strict_page: Page, nc: nats.NATS, name: str
) -> None:
    """A consumer's limits changed from its form; what the form does not show stays."""
    page = strict_page
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    await js.add_consumer(
        name, ConsumerConfig(durable_name="c1", ack_wait=30, deliver_policy=DeliverPolicy.LAST)
    )
    await page.goto(f"{base_url}/ui/#/streams/{name}/consumers/c1")
    await page.locator("#edit-consumer-box summary").click()
    form = page.locator("#edit-consumer")
    await form.locator("[name=ack_wait]").fill("45s")
    await form.locator("[name=max_deliver]").fill("7")
    await form.locator("[name=max_ack_pending]").fill("50")
    await form.locator("[name=max_batch]").fill("20")
    await form.get_by_role("button", name="Save changes").click()
    await expect(page.locator("#flash")).to_contain_text("Consumer c1 updated.")
    await settled(page)
    config = (await js.consumer_info(name, "c1")).config
    assert (config.ack_wait, config.max_deliver, config.max_ack_pending) == (45, 7, 50)
    raw = await nc.request(f"$JS.API.CONSUMER.INFO.{name}.c1", b"")
    assert json.loads(raw.data)["config"]["max_batch"] == 20  # (nats-py's config has no field)
    assert config.deliver_policy == DeliverPolicy.LAST
