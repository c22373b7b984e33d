"""What the contract tests share: a gateway of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on a nats-server of the module's own: what a module creates (fuzzed configs
    capture any subject) meets nothing of another's."""
    store = tmp_path_factory.mktemp("contract-store")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    try:
        with served_gateway(gateway_settings(server.url, request_timeout=1.0)) as url:
            yield url
    finally:
        server.stop()
