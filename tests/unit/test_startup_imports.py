"""What a gateway loads before it serves anything: not the libraries that only some answers
need (pyarrow and numpy, a third of its memory at start, for Arrow answers alone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ON_FIRST_USE = ("pyarrow", "numpy")


def test_the_app_is_built_without_the_libraries_of_arrow_answers() -> None:
    script = (
        "import sys\n"
        "from app.config import Settings\n"
        "from app.direct import arrow\n"
        "from app.main import create_app\n"
        "create_app(Settings(nats_url=['nats://127.0.0.1:4222']))\n"
        "assert arrow.available()\n"  # installed here (the spark extra), not imported
        f"print(sorted(m for m in {ON_FIRST_USE!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
