"""Fixtures of the fault tests: one 3-node JetStream cluster shared by the tests of this package."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.nats.embedded import EmbeddedServerError
from tests.cluster import Cluster
from tests.faults.netns import HarnessUnavailable, Partition, check_available
from tests.faults.netns import partition as running_partition


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory, nats_binary: str | None) -> Iterator[Cluster]:
    """Three nats-servers routed to each other on loopback, JetStream on, meta leader elected.

    A test that kills a node restarts it before it ends (see ``Cluster.kill``); the fixture
    stops every node when the package's tests are done.
    """
    nodes = _started(tmp_path_factory, nats_binary)
    try:
        asyncio.run(nodes.wait_for_jetstream())
        yield nodes
    finally:
        nodes.stop()


def _started(
    tmp_path_factory: pytest.TempPathFactory, binary: str | None, attempts: int = 3
) -> Cluster:
    """The route ports are picked before the nodes bind them: if another process took one in
    between, the node exits at start-up, and a new set of ports is tried."""
    for attempt in range(attempts):
        nodes = Cluster(tmp_path_factory.mktemp("cluster"), binary=binary)
        try:
            nodes.start()
            return nodes
        except EmbeddedServerError:
            nodes.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
async def healed(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The cluster, ready for JetStream; every node is started again after the test."""
    await cluster.wait_for_jetstream()
    yield cluster
    for name, node in cluster.nodes.items():
        if not node.running:
            await cluster.start_node(name)


@pytest.fixture
def partition_env() -> dict[str, str]:
    """Extra JSGW_* variables for the ``partition`` fixture's gateway: override the fixture
    or parametrize it (``@pytest.mark.parametrize("partition_env", [{...}])``)."""
    return {}


@pytest.fixture
def partition(tmp_path: Path, partition_env: dict[str, str]) -> Iterator[Partition]:
    """Three nodes, a switch and a real ``jsgw serve`` in network namespaces (see
    tests/faults/netns.py); skipped where namespaces cannot be made. Torn down even on failure."""
    try:
        check_available()
    except HarnessUnavailable as exc:
        pytest.skip(f"partition tests need network namespaces: {exc}")
    with running_partition(tmp_path, gateway_env=partition_env) as harness:
        yield harness
