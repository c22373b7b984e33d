"""The console's object buckets in a real browser: a file uploaded from the view is stored
as an object nats-py reads, listed, downloaded through the view and deleted from it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import nats
from playwright.async_api import Page, expect

from app.nats.embedded import EmbeddedServer
from tests.browser.support import settled


async def test_object_buckets_view_uploads_lists_downloads_deletes(
    base_url: str,
    strict_page: Page,
    nats_server: EmbeddedServer,
    name: str,
    tmp_path: Path,
    screenshots: Path,
) -> None:
    page = strict_page
    content = os.urandom(300_000)  # three chunks
    upload = tmp_path / "report.bin"
    upload.write_bytes(content)
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        assert (await http.put(f"/v1/obj/{name}")).status_code == 201
        await http.put(
            f"/v1/obj/{name}/objects/notes.txt",
            content=b"hello",
            headers={"Content-Type": "text/plain"},
        )

    await page.goto(f"{base_url}/ui/#/")
    await page.get_by_role("link", name="Object buckets →").click()
    await page.get_by_role("link", name=name, exact=True).click()
    rows = page.locator("#objects tbody tr")
    await expect(rows).to_have_count(1)
    await expect(page.locator('#objects tr[data-name="notes.txt"]')).to_contain_text("text/plain")

    await page.locator('input[name="file"]').set_input_files(str(upload))
    await page.locator('input[name="name"]').fill("dir/report.bin")
    await page.get_by_role("button", name="Upload").click()
    await expect(page.locator("#flash")).to_contain_text("Uploaded dir/report.bin")
    await settled(page)
    row = page.locator('#objects tr[data-name="dir/report.bin"]')
    await expect(row).to_contain_text("report.bin")
    await expect(rows).to_have_count(2)
    await page.screenshot(path=screenshots / "console-objects.png", full_page=True)

    # What the view uploaded is an ordinary ADR-20 object.
    nc = await nats.connect(nats_server.url)
    try:
        store = await nc.jetstream().object_store(name)
        assert (await store.get("dir/report.bin")).data == content
    finally:
        await nc.close()

    async with page.expect_download() as downloading:
        await row.get_by_role("button", name="Download").click()
    download = await downloading.value
    assert download.suggested_filename == "report.bin"
    assert Path(await download.path()).read_bytes() == content

    await row.get_by_role("button", name="Delete").click()
    await expect(page.locator("#flash")).to_contain_text("Deleted dir/report.bin")
    await settled(page)
    await expect(rows).to_have_count(1)
