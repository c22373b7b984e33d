"""The pages the ``type`` URLs of problem documents lead to, written from the code registry.

Every problem's ``type`` is ``https://jsgw.dev/problems/<code>``: docs/problems/<code>.md is
that page, docs/problems/index.md the table of all codes. ``jsgw docs`` writes them from
:class:`app.errors.ErrorCode`; a test fails when the committed pages drift from it.
"""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path

from app.errors import PROBLEM_TYPE_BASE, ErrorCode, WarningCode, jetstream_err_codes

# The codes raised with a status of their own (``status=``) rather than their class's.
_STATUS_NOTES = {
    ErrorCode.HTTP_ERROR: "the status of the refusal",
    ErrorCode.JETSTREAM_BAD_REQUEST: "400, or the 4xx JetStream answered",
}


def _status(code: ErrorCode) -> str:
    return _STATUS_NOTES.get(code) or f"{code.status} {HTTPStatus(code.status).phrase}"


def code_page(code: ErrorCode) -> str:
    lines = [
        f"# {code}",
        "",
        code.meaning,
        "",
        f"- HTTP status: {_status(code)}",
        f"- `type`: `{PROBLEM_TYPE_BASE}{code}`",
    ]
    err_codes = jetstream_err_codes(code)
    if err_codes:
        lines.append("- JetStream `err_code`: " + ", ".join(str(n) for n in err_codes))
    lines += [
        "",
        "The problem document's `detail` says what happened in this case; `nats`, when present,",
        "holds what the NATS server answered. [All codes](index.md)",
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def index_page() -> str:
    lines = [
        "# Problem codes",
        "",
        "Every error is an RFC 9457 `application/problem+json` document with a stable `code`;",
        f"its `type` is `{PROBLEM_TYPE_BASE}<code>`, the page of that code. Branch on `code`",
        "(or on the status), never on `detail`, which is for people.",
        "",
        "| Code | HTTP status | Meaning |",
        "| --- | --- | --- |",
    ]
    for code in sorted(ErrorCode, key=lambda c: (c.status, c.value)):
        lines.append(f"| [`{code}`]({code}.md) | {_status(code)} | {_cell(code.meaning)} |")
    lines += [
        "",
        "## Warnings on a consume stream",
        "",
        "A consume (`GET /v1/streams/{stream}/consumers/{consumer}/consume`, Server-Sent Events)",
        "goes on after a `warning` event. Its `code` is one of these, or the code of a refused",
        "pull above.",
        "",
        "| Code | Meaning |",
        "| --- | --- |",
    ]
    for warning in sorted(WarningCode, key=lambda w: w.value):
        lines.append(f"| `{warning}` | {_cell(warning.meaning)} |")
    lines.append("")
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """File name (in docs/problems/) -> text, for every page."""
    out = {"index.md": index_page()}
    out.update({f"{code}.md": code_page(code) for code in ErrorCode})
    return out


def write(directory: Path) -> list[Path]:
    """Write every page into ``directory``, and remove the pages of codes that are gone."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = pages()
    for stale in directory.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()
    written = []
    for name, text in wanted.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
