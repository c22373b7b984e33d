"""The releases `make compat` and `make test` run the integration tests against are the ones
the documentation names, and the oldest is the one the release tests start."""

from __future__ import annotations

import re
from pathlib import Path

from tests.releases import OLDEST

ROOT = Path(__file__).resolve().parents[2]


def compat_releases() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    found = re.search(r"^COMPAT_RELEASES := (.+)$", makefile, re.M)
    assert found, "Makefile has no COMPAT_RELEASES"
    return found[1].split()


def test_make_test_runs_the_oldest_release() -> None:
    assert compat_releases()[0] == OLDEST


def test_the_releases_page_reports_each_release_run() -> None:
    page = (ROOT / "docs" / "releases.md").read_text()
    for release in compat_releases():
        assert f"| {release} |" in page, f"docs/releases.md has no row for {release}"
