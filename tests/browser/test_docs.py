"""/docs in a real browser, with every request outside the gateway blocked."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page, Route, expect


async def test_docs_load_nothing_from_outside(base_url: str, page: Page, screenshots: Path) -> None:
    outside: list[str] = []
    loaded: list[str] = []

    async def gate(route: Route) -> None:
        url = route.request.url
        if url.startswith((base_url + "/", "data:")):
            loaded.append(url)
            await route.continue_()
        else:
            outside.append(url)
            await route.abort()

    await page.context.route("**/*", gate)
    await page.goto(base_url + "/docs")
    await expect(page.locator(".swagger-ui .info .title")).to_contain_text("jsgw")
    await expect(page.locator(".opblock-summary-path").first).to_be_visible()
    assert not outside, f"/docs asked for {outside}"
    assert f"{base_url}/openapi.json" in loaded, loaded
    assert f"{base_url}/docs/assets/swagger-ui-bundle.js" in loaded, loaded
    await page.screenshot(path=screenshots / "docs.png")
