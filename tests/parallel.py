"""How `make test` spreads the suite over processes (pytest-xdist, ``-n 2 --dist loadscope``).

A process takes a *unit* at a time and runs its tests in their order, as a serial run would. A
unit is a module (its module-scoped servers and gateways are made once), or a package whose
modules share one fixture of the process: tests/spark (one Spark session, a JVM) and
tests/faults (one 3-node cluster). tests/faults/test_partitions.py is a unit of its own: it
builds its own topology per test. The tests of tests/contract/test_fuzz.py (one per operation,
minutes in all, each with its own examples) are units each, so that they spread.

The units that take a minute or more are handed out first, so that the short ones fill in
around them; the rest go by their number of tests, most first (xdist's own order). The SOLO
units, whose tests bound a latency tightly enough that the suite's own load would decide
them, run last, one after the other, when no other test of the run is running.

The grouping is made by the scheduler in the controlling process, from each test's node id
(``pytest_xdist_make_scheduler`` in tests/conftest.py), not by ``xdist_group`` marks:
``--dist loadgroup`` passes a test's group by rewriting its node id, which pytest 9.2's node ids
no longer allow (pytest-xdist issue 1386), and its tests would then silently spread over every
process. tests/unit/test_parallel.py checks the xdist names used here.
"""

from __future__ import annotations

from typing import Any

# Packages whose modules share a fixture of the process.
SHARED_PACKAGES = ("tests/spark", "tests/faults")
OWN_UNITS = ("tests/faults/test_partitions.py",)
# Modules whose tests are units each.
SPLIT_MODULES = ("tests/contract/test_fuzz.py",)
# Longest first: a unit handed out late sets the end of the run.
LONG_UNITS = (
    "tests/spark",
    "tests/faults",
    "tests/integration/test_metrics_workers.py",
)
# Alone at the end: a real browser's page loads and live updates against deadlines of 1 to
# 5 s, the gateway's answers (200 ms) while attackers send their largest bodies, the time of
# a deep page against a shallow one, slow heads closed within their timeout + 1.5 s, and the
# partitions' answers within the request timeout + margin while nodes are cut off.
SOLO_UNITS = (
    "tests/browser/test_console.py",
    "tests/browser/test_admin.py",
    "tests/browser/test_docs.py",
    "tests/browser/test_eventsource.py",
    "tests/browser/test_subscriptions.py",
    "tests/browser/test_objects.py",
    "tests/security/test_resource_bounds.py",
    "tests/integration/test_kv_keys.py",
    "tests/integration/test_slow_clients.py",
    "tests/faults/test_partitions.py",
)


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: its package in SHARED_PACKAGES, else its module (or itself,
    in SPLIT_MODULES)."""
    module = nodeid.split("::", 1)[0]
    if module in OWN_UNITS:
        return module
    if module in SPLIT_MODULES:
        return nodeid
    package = module.rsplit("/", 1)[0]
    return package if package in SHARED_PACKAGES else module


def rank(unit: str) -> int:
    """Where a unit goes in the queue: LONG_UNITS in their order, then the others."""
    return LONG_UNITS.index(unit) if unit in LONG_UNITS else len(LONG_UNITS)


def make_scheduler(config: Any, log: Any) -> Any:
    """xdist's ``loadscope`` scheduling, with :func:`unit_of` as the scope, LONG_UNITS handed
    out first and SOLO_UNITS held back until the rest is done."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def add_node_collection(self, node: Any, collection: list[str]) -> None:
            # loadscope keys a unit's tests by node id, and would run one test of several
            # that share one: under pytest 9.2 the tests schemathesis makes of one function
            # (one per operation, tests/contract/test_fuzz.py) all have the function's node
            # id. Each repeat is told apart by its place in the collection.
            seen: dict[str, int] = {}
            unique = []
            for nodeid in collection:
                seen[nodeid] = seen.get(nodeid, 0) + 1
                unique.append(nodeid if seen[nodeid] == 1 else f"{nodeid}#{seen[nodeid]}")
            super().add_node_collection(node, unique)

        def _assign_work_unit(self, node: Any) -> None:
            queue = self.workqueue
            if not self._ordered:  # the first call: the queue is complete
                for unit in sorted(queue, key=rank):
                    queue.move_to_end(unit)
                for unit in SOLO_UNITS:
                    if unit in queue:
                        queue.move_to_end(unit)
                self._ordered = True
            if next(iter(queue)) in SOLO_UNITS:
                others = [n for n in self.assigned_work if n is not node]
                busy = [n for n in others if self._pending_of(self.assigned_work[n])]
                if any(not n.shutting_down for n in busy):
                    # Another process is still at work: the solo units are left to the last
                    # one. This one stops (a worker holds its last test until it is sent more
                    # or told to stop).
                    node.shutdown()
                    return
                if busy:  # their last tests: asked again when they are gone (remove_node)
                    return
            super()._assign_work_unit(node)

        def remove_node(self, node: Any) -> Any:
            crashed = super().remove_node(node)
            for other in list(self.assigned_work):
                self._reschedule(other)
            return crashed

    return UnitScheduling(config, log)
