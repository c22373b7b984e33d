"""The web console (``/ui``) and the API docs (``/docs``), served from files.

Nothing is loaded from a CDN: clusters are often offline. The console is plain HTML, CSS and
JavaScript in ``static/`` (shipped in the wheel); Swagger UI's files come from the
``fastapi-offline`` package. These are not API routes: they are public even with auth on,
and everything the console shows comes through the authenticated API. There is no ReDoc
page: ReDoc fetches its logo from its CDN whatever it is told.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
DOC_ASSETS = Path(str(files("fastapi_offline") / "static"))

_ASSETS = "/docs/assets"
_FAVICON = "/ui/favicon.svg"


def install(app: FastAPI) -> None:
    """Mount the console and the docs (the app is made with ``docs_url=None``)."""
    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")
    app.mount(_ASSETS, StaticFiles(directory=DOC_ASSETS), name="docs-assets")
    app.add_route("/docs", _swagger(app), include_in_schema=False)
    app.add_route("/", _to_console, include_in_schema=False)
    app.add_route("/ui", _to_console, include_in_schema=False)  # (no slash redirects: app.main)


Page = Callable[[Request], Awaitable[HTMLResponse]]


def _swagger(app: FastAPI) -> Page:
    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{_ASSETS}/swagger-ui.css",
            swagger_favicon_url=root + _FAVICON,
            # Swagger UI would otherwise ask validator.swagger.io about the spec.
            swagger_ui_parameters={"validatorUrl": None},
        )

    return page


async def _to_console(request: Request) -> RedirectResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    return RedirectResponse(root + "/ui/", status_code=307)
