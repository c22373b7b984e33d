"""Repeat the network-partition scenarios of tests/faults/test_partitions.py and tabulate them.

    .venv/bin/python -m bench.partitions --rounds 3 [-k minority] [--src DIR] [--figures FILE]

Runs pytest on that file with ``JSGW_PARTITION_ROUNDS`` and ``JSGW_PARTITION_FIGURES`` set
(root and network namespaces needed; see tests/faults/netns.py), then prints one row per run.
``--src DIR`` runs the gateway from another source tree (``git archive <commit> app routers |
tar -x -C DIR``) to compare two versions on the same scenarios. ``--table FILE`` only prints
the table of an existing figures file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = [
    ("scenario", "scenario", 24),
    ("requests", "reqs", 6),
    ("acked_lost", "lost", 5),
    ("duplicate_msg_ids", "dups", 5),
    ("cas_lost", "casL", 5),
    ("refused_but_stored", "412st", 6),
    ("watch_missed", "wMiss", 6),
    ("watch_repeated", "wRep", 5),
    ("consume_missing", "cMiss", 6),
    ("stale_kv_max", "staleKV", 8),
    ("stale_kv_leader_reads", "staleLdrKV", 11),
    ("stale_leader_reads", "staleLdrDG", 11),
    ("heal_to_first_success", "heal1st", 8),
    ("heal_to_all_success", "healAll", 8),
    ("fault_to_steady", "steady", 7),
    ("full_timeout_waits", "fullTO", 7),
    ("slow_answers", "slow", 5),
    ("unexpected", "unexp", 6),
]


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    head = " ".join(f"{title:>{width}}" for _, title, width in COLUMNS)
    out = [head]
    for row in rows:
        cells = []
        for key, _, width in COLUMNS:
            value = row.get(key)
            text = (
                "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)
            )
            cells.append(f"{text:>{width}}")
        out.append(" ".join(cells))
        errors = ", ".join(f"{k}: {v}" for k, v in (row.get("errors_by_code") or {}).items())
        if errors:
            out.append(f"{'':>24}   {errors}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", dest="keyword", default="not tears_down", help="pytest -k expression")
    parser.add_argument("--src", help="run the gateway from this source tree")
    parser.add_argument("--figures", help="append the figures here (default: a temporary file)")
    parser.add_argument("--table", help="only print the table of this figures file")
    args = parser.parse_args(argv)
    if args.table:
        print(table(Path(args.table)))
        return 0
    figures = Path(args.figures or tempfile.mkstemp(prefix="jsgw-partitions-", suffix=".jsonl")[1])
    env = dict(
        os.environ, JSGW_PARTITION_ROUNDS=str(args.rounds), JSGW_PARTITION_FIGURES=str(figures)
    )
    if args.src:
        env["JSGW_PARTITION_SRC"] = str(Path(args.src).resolve())
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/faults/test_partitions.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        args.keyword,
    ]
    done = subprocess.run(command, cwd=ROOT, env=env)
    print(f"\nfigures: {figures}\n{table(figures)}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
