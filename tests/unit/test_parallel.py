"""`make test`'s parallel run (tests/parallel.py): the units, their order, and the solo ones.

The scheduler is xdist's own ``loadscope`` one with its scope and its choice of the next unit
replaced; these tests drive it with stand-in processes, so an xdist release that renames what
it overrides fails here rather than spreading a Spark session or a cluster over processes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.parallel import (
    LONG_UNITS,
    OWN_UNITS,
    SHARED_PACKAGES,
    SOLO_UNITS,
    SPLIT_MODULES,
    make_scheduler,
    unit_of,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_named_units_exist() -> None:
    for unit in {*SHARED_PACKAGES, *OWN_UNITS, *SPLIT_MODULES, *LONG_UNITS, *SOLO_UNITS}:
        assert (ROOT / unit).exists(), f"tests/parallel.py names {unit}, which is gone"


def test_units() -> None:
    assert unit_of("tests/spark/test_kv.py::test_a") == "tests/spark"
    assert unit_of("tests/spark/test_write.py::test_b[x-y]") == "tests/spark"
    assert unit_of("tests/faults/test_cluster_kv.py::test_c") == "tests/faults"
    assert unit_of("tests/faults/test_replicas.py::test_d") == "tests/faults"
    assert unit_of("tests/faults/test_partitions.py::test_e[round0]") == (
        "tests/faults/test_partitions.py"
    )
    assert unit_of("tests/unit/test_wire.py::test_f[a::b]") == "tests/unit/test_wire.py"
    split = "tests/contract/test_fuzz.py::test_x#2"  # (a repeated node id, see make_scheduler)
    assert unit_of(split) == split
    assert unit_of("tests/integration/test_kv_watch.py::test_g") == (
        "tests/integration/test_kv_watch.py"
    )


class Process:
    """What the scheduler sees of a pytest-xdist worker, which runs the tests it is sent in
    order but holds its last one (for its teardown it must know the next) until it is sent
    more or told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []
        self.ran = 0

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def runnable(self) -> bool:
        return self.ran < len(self.sent) - (0 if self.shutting_down else 1)


COLLECTION = [
    "tests/unit/test_wire.py::test_1",
    "tests/unit/test_wire.py::test_2",
    "tests/unit/test_wire.py::test_3",
    "tests/browser/test_docs.py::test_4",
    "tests/spark/test_kv.py::test_5",
    "tests/integration/test_kv_watch.py::test_6",
    "tests/spark/test_write.py::test_7",
    "tests/faults/test_partitions.py::test_8",
    "tests/faults/test_cluster_kv.py::test_9",
    "tests/faults/test_replicas.py::test_10",
    "tests/security/test_resource_bounds.py::test_11",
    "tests/integration/test_kv_watch.py::test_12",
    "tests/unit/test_wire.py::test_13",
    # Tests that share a node id (schemathesis's, one per operation, under pytest 9.2).
    "tests/contract/test_fuzz.py::test_operations_conform",
    "tests/contract/test_fuzz.py::test_operations_conform",
    "tests/contract/test_fuzz.py::test_operations_conform",
    "tests/contract/test_fuzz.py::test_stateful_workflows",
]


def started(speeds: list[int]) -> tuple[object, list[Process]]:
    config = SimpleNamespace(
        getvalue=lambda name: {"tx": [f"{len(speeds)}*popen"]}[name],
        option=SimpleNamespace(loadscopereorder=True),
    )
    scheduler = make_scheduler(config, None)
    processes = [Process(f"gw{n}") for n in range(len(speeds))]
    for process in processes:
        scheduler.add_node(process)
    for process in processes:
        scheduler.add_node_collection(process, COLLECTION)
    scheduler.schedule()
    return scheduler, processes


def run(speeds: list[int]) -> tuple[list[Process], dict[int, int]]:
    """The run to its end, each process running ``speeds[n]`` tests per tick, one process after
    the other; the order the tests ended in. Fails if the run stops with tests left (each
    process waiting)."""
    scheduler, processes = started(speeds)
    ended: dict[int, int] = {}
    tick = 0
    while any(p.ran < len(p.sent) for p in processes) or not scheduler.tests_finished:  # type: ignore[attr-defined]
        if scheduler.tests_finished:  # type: ignore[attr-defined]
            for process in processes:  # (xdist's DSession then stops every process)
                process.shutdown()
        tick += 1
        assert tick < 1000, f"the run hangs: {[(p.sent, p.ran) for p in processes]}"
        for process, speed in zip(processes, speeds, strict=True):
            for _ in range(speed):
                if not process.runnable():
                    break
                index = process.sent[process.ran]
                process.ran += 1
                ended[index] = len(ended)
                scheduler.mark_test_complete(process, index)  # type: ignore[attr-defined]
            gone = process.shutting_down and not process.runnable()
            if gone and process in scheduler.nodes:  # type: ignore[attr-defined]
                scheduler.remove_node(process)  # type: ignore[attr-defined]
    return processes, ended


def units(process: Process) -> list[str]:
    return list(dict.fromkeys(unit_of(COLLECTION[i]) for i in process.sent))


def test_long_units_first_and_shared_fixtures_in_one_process() -> None:
    _, processes = started([1, 1])
    assert [units(p)[0] for p in processes] == ["tests/spark", "tests/faults"]


@pytest.mark.parametrize("speeds", [[1, 1, 1], [1, 2, 3], [3, 1, 1], [1, 1, 5], [2, 2]])
def test_every_test_once_units_whole_solo_last(speeds: list[int]) -> None:
    processes, ended = run(speeds)
    assert sorted(ended) == list(range(len(COLLECTION))), "a test ran twice or not at all"
    for unit in {unit_of(n) for n in COLLECTION if not n.startswith(SPLIT_MODULES)}:
        holders = [p for p in processes if unit in units(p)]
        assert len(holders) == 1, f"{unit} was spread over {len(holders)} processes"
        tests = [i for i, n in enumerate(COLLECTION) if unit_of(n) == unit]
        sent = [i for p in holders for i in p.sent if i in tests]
        assert sent == tests, f"{unit}: its tests out of their order"
    solo = [i for i, n in enumerate(COLLECTION) if unit_of(n) in SOLO_UNITS]
    runners = [p for p in processes if any(i in solo for i in p.sent)]
    assert len(runners) == 1, "the solo units ran in more than one process"
    elsewhere = [i for p in processes if p is not runners[0] for i in p.sent]
    assert min(ended[i] for i in solo) > max(ended[i] for i in elsewhere), (
        "a solo test ran alongside another process's test"
    )
