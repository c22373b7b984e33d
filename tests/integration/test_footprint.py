"""What a worker loads and holds while it pushes to no endpoint.

httpx is the gateway's URL parser for push endpoints and nothing else (app.push.allowlist
``http_url``), and importing it costs a worker about 13 MB: it is imported on the first
endpoint or explicit allowlist, never by a gateway that pushes nowhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.nats.embedded import EmbeddedServer
from app.push.allowlist import DEFAULT_ALLOWED, Allowlist

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, json, sys
from asgi_lifespan import LifespanManager
from app.config import Settings
from app.main import create_app

async def main():
    settings = json.loads(sys.argv[3])
    app = create_app(Settings(nats_url=[sys.argv[1]], data_dir=sys.argv[2], **settings))
    async with LifespanManager(app):
        await asyncio.sleep(0.2)
        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))

asyncio.run(main())
"""


def loaded(nats_server: EmbeddedServer, tmp_path: Path, **settings: object) -> set[str]:
    """The top-level packages a started gateway (its lifespan, in a fresh process) loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, nats_server.url, str(tmp_path), json.dumps(settings)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_gateway_that_pushes_nowhere_never_imports_httpx(
    nats_server: EmbeddedServer, tmp_path: Path
) -> None:
    assert "httpx" not in loaded(nats_server, tmp_path)
    # An explicit allowlist is checked at start-up, with httpx.
    explicit = loaded(nats_server, tmp_path, push_allowed_urls=["http://127.0.0.1:9999/hooks"])
    assert "httpx" in explicit


def test_the_default_allowlist_parses_and_allows_the_local_host() -> None:
    """The defaults are not parsed at start-up (they are constants): they must parse."""
    allowlist = Allowlist(DEFAULT_ALLOWED)
    assert allowlist.allows("http://127.0.0.1:8080/hooks")
    assert allowlist.allows("http://localhost/x")
    assert not allowlist.allows("http://127.0.0.1.example/x")
