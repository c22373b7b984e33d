"""Contract fuzzing: schemathesis drives every operation of the committed spec against a real
gateway and nats-server. No response may be a 5xx (other than 503/504 from NATS, which are
documented), and every response must match what the spec documents for it. Times and durations
come with their extremes (tests/security/extremes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway
from tests.security.extremes import FORMATS

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
# SSE feeds never end by themselves, so each fuzzed call would wait for its timeout: they are
# left to their own tests (tests/integration/test_kv_watch.py, test_consumers_consume.py).
SSE_PATHS = ("/v1/kv/{bucket}/watch", "/v1/streams/{stream}/consumers/{consumer}/consume")
# Times and durations include their extremes (a date past 9999 once in UTC, an int64 overflow of
# nanoseconds): schemathesis's own date-time strategy never leaves the representable range.
for name, strategy in FORMATS.items():
    schemathesis.openapi.format(name, strategy)
schema = schemathesis.openapi.from_path(str(SPEC)).exclude(path=list(SSE_PATHS))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on its own nats-server: fuzzed configs may capture any subject."""
    store = tmp_path_factory.mktemp("fuzz-store")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    try:
        with served_gateway(gateway_settings(server.url, request_timeout=1.0)) as url:
            yield url
    finally:
        server.stop()


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_operations_conform(case: schemathesis.Case, gateway_url: str) -> None:
    response = case.call(base_url=gateway_url, timeout=10)
    assert response.status_code not in (500, 501, 502), response.text
    case.validate_response(
        response,
        checks=[
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_schema_conformance,
        ],
    )
