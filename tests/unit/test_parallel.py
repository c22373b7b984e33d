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
    make_scheduler,
    unit_of,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_named_units_exist() -> None:
    for unit in {*SHARED_PACKAGES, *OWN_UNITS, *LONG_UNITS, *SOLO_UNITS}:
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
    assert unit_of("tests/integration/test_kv_watch.py::test_g") == (
        "tests/integration/test_kv_watch.py"
    )


class Process:
    """What the scheduler sees of a pytest-xdist worker."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


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
]


@pytest.fixture
def run() -> tuple[object, list[Process]]:
    config = SimpleNamespace(
        getvalue=lambda name: {"tx": ["3*popen"]}[name],
        option=SimpleNamespace(loadscopereorder=True),
    )
    scheduler = make_scheduler(config, None)
    processes = [Process(f"gw{n}") for n in range(3)]
    for process in processes:
        scheduler.add_node(process)
    for process in processes:
        scheduler.add_node_collection(process, COLLECTION)
    scheduler.schedule()
    return scheduler, processes


def units(process: Process) -> list[str]:
    return list(dict.fromkeys(unit_of(COLLECTION[i]) for i in process.sent))


def finish(scheduler: object, process: Process) -> None:
    """The process runs what it was sent, one test after the other."""
    done = 0
    while done < len(process.sent):
        scheduler.mark_test_complete(process, process.sent[done])  # type: ignore[attr-defined]
        done += 1


def test_long_units_first_and_shared_fixtures_in_one_process(
    run: tuple[object, list[Process]],
) -> None:
    scheduler, (a, b, c) = run
    assert [units(p)[0] for p in (a, b, c)] == [
        "tests/faults/test_partitions.py",
        "tests/spark",
        "tests/faults",
    ]
    # A unit's tests go to one process, in their order.
    spark = [COLLECTION.index(n) for n in COLLECTION if n.startswith("tests/spark/")]
    assert [i for i in b.sent if i in spark] == spark
    for process in (a, b, c):
        finish(scheduler, process)
    everything = sorted(a.sent + b.sent + c.sent)
    assert everything == list(range(len(COLLECTION))), "a test ran twice or not at all"
    for unit in {unit_of(n) for n in COLLECTION}:
        holders = [p for p in (a, b, c) if unit in units(p)]
        assert len(holders) == 1, f"{unit} was spread over {len(holders)} processes"
    assert scheduler.tests_finished  # type: ignore[attr-defined]


def test_solo_units_wait_for_everything_else(run: tuple[object, list[Process]]) -> None:
    scheduler, (a, b, c) = run
    finish(scheduler, a)  # partitions done; spark and faults still running elsewhere
    finish(scheduler, a)  # a takes what is left that is not solo, and ends it
    solo = [i for i, n in enumerate(COLLECTION) if unit_of(n) in SOLO_UNITS]
    assert not any(i in solo for i in a.sent + b.sent + c.sent), "a solo unit ran alongside"
    finish(scheduler, b)
    assert not any(i in solo for i in b.sent), "a solo unit started while c was running"
    finish(scheduler, c)  # the last one to finish takes them all, one after the other
    assert sorted(i for i in c.sent if i in solo) == solo
    assert not any(i in solo for i in a.sent + b.sent)
    assert scheduler.tests_finished  # type: ignore[attr-defined]
