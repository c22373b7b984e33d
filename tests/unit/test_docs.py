"""The documentation: a short README that leads into docs/, and docs/ as a MkDocs site that
builds with --strict (no broken link or anchor, no page left out of the navigation)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from app.config import Settings
from app.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The README is the front door: what jsgw is, the two commands, a short tour, where to go
# next. The manual is docs/.
README_MAX_BYTES = 15_000

# [text](target) outside code; a target up to its first space (a title may follow).
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def _outside_code(markdown: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    markdown = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", markdown)


def test_the_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size < README_MAX_BYTES, (
        f"README.md is {size:,} bytes (at most {README_MAX_BYTES:,}): move the detail into a "
        "page of docs/ and link to it"
    )


def test_the_readmes_relative_links_lead_to_files() -> None:
    targets = _LINK.findall(_outside_code(README.read_text()))
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and t[0] != "#"]
    assert relative, "README.md links to nothing in the repository"
    missing = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    into_docs = [t for t in relative if t.startswith("docs/")]
    not_pages = [t for t in into_docs if not t.split("#")[0].endswith(".md")]
    assert not not_pages, f"README.md should link to the pages' .md files: {not_pages}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`: mkdocs.yml's validation turns a link to a missing page or
    anchor, and a page missing from the navigation, into warnings, which --strict fails."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "problems" / "index.html").is_file()


def _setting_rows() -> dict[str, str]:
    """docs/configuration.md's table: each variable named in a row's first cell -> the row's
    default cell, or "" for a row that names several variables."""
    rows: dict[str, str] = {}
    for line in (DOCS / "configuration.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3:
            continue
        names = re.findall(r"`(JSGW_[A-Z0-9_]+)`", cells[0])
        for name in names:
            rows[name] = cells[1] if len(names) == 1 else ""
    return rows


def _variables() -> dict[str, object]:
    """Every environment variable the gateway reads -> its default."""
    prefix = Settings.model_config.get("env_prefix", "")
    return {
        f"{prefix}{name}".upper(): field.get_default(call_default_factory=True)
        for name, field in Settings.model_fields.items()
    }


def test_every_setting_has_a_row_in_the_configuration_table() -> None:
    rows = _setting_rows()
    variables = _variables()
    missing = sorted(set(variables) - set(rows))
    assert not missing, f"docs/configuration.md has no row for: {', '.join(missing)}"
    unknown = sorted(set(rows) - set(variables))
    assert not unknown, f"docs/configuration.md names settings that do not exist: {unknown}"


def test_the_configuration_tables_defaults_are_the_codes() -> None:
    """A row of one variable whose default is a plain value (`2`, `true`, `./data`) gives the
    default of the code."""
    wrong = []
    for name, cell in _setting_rows().items():
        written = re.fullmatch(r"`([^`]+)`", cell)
        if written is None:
            continue  # several variables, no default, or words ("random per process")
        default = _variables()[name]
        text = written.group(1)
        if isinstance(default, bool):
            same = text == str(default).lower()
        elif isinstance(default, int | float):
            same = float(text) == default
        else:
            same = text == str(default) or Path(text) == default
        if not same:
            wrong.append(f"{name}: the table says {text}, the code {default!r}")
    assert not wrong, "docs/configuration.md: " + "; ".join(wrong)


def test_every_metric_has_a_row_on_the_operations_page() -> None:
    page = (DOCS / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(jsgw_[a-z0-9_]+)` \|", page, re.MULTILINE))
    exposed = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics().registry.collect()
    }
    missing = sorted(exposed - documented)
    assert not missing, f"docs/operations.md has no row for the metrics: {', '.join(missing)}"
    unknown = sorted(documented - exposed)
    assert not unknown, f"docs/operations.md names metrics that do not exist: {unknown}"
