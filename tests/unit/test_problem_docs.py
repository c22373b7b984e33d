"""The committed docs/problems/ pages are what the registry writes; regenerate with
`make problems` (`jsgw docs -o docs/problems`)."""

from __future__ import annotations

from pathlib import Path

from app import problem_docs
from app.errors import ErrorCode

PAGES = Path(__file__).resolve().parents[2] / "docs" / "problems"


def test_committed_pages_match_the_registry() -> None:
    committed = {path.name: path.read_text() for path in PAGES.glob("*.md")}
    assert committed == problem_docs.pages(), (
        "docs/problems/ is out of date: run `make problems` (jsgw docs -o docs/problems)"
    )


def test_every_code_has_a_page_and_a_row() -> None:
    pages = problem_docs.pages()
    index = pages["index.md"]
    for code in ErrorCode:
        assert pages[f"{code}.md"].startswith(f"# {code}\n")
        assert f"[`{code}`]({code}.md)" in index


def test_write_removes_the_pages_of_codes_that_are_gone(tmp_path: Path) -> None:
    (tmp_path / "old.code.md").write_text("# old.code\n")
    problem_docs.write(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.md")) == sorted(problem_docs.pages())
