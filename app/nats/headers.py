"""NATS header blocks (``NATS/1.0 <status> <description>`` + MIME-style lines).

nats-py folds repeated header names into one value; the gateway keeps every value, since a
stored message may carry several, so it parses the raw block where it has one.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

_PREFIX = "NATS/1.0"
_ASCII_SPACE = " \t\r\n\x0b\x0c"  # what bytes.strip() strips: the status line's


@dataclass(slots=True)
class HeaderBlock:
    status: int | None = None
    description: str = ""
    values: dict[str, list[str]] = field(default_factory=dict)

    def first(self, name: str) -> str | None:
        found = self.values.get(name)
        if found:
            return found[0]
        lowered = name.lower()
        for key, vals in self.values.items():
            if key.lower() == lowered and vals:
                return vals[0]
        return None


def parse(raw: bytes | None) -> HeaderBlock:
    if not raw:
        return HeaderBlock()
    first, *lines = split_block(raw)
    status: int | None = None
    description = ""
    if first.startswith(_PREFIX):
        rest = first[len(_PREFIX) :].strip(_ASCII_SPACE)
        if rest:
            code, _, text = rest.partition(" ")
            if code.isascii() and code.isdigit():
                status = int(code)
                description = text.strip()
    return HeaderBlock(status, description, values_of(lines))


def split_block(raw: bytes) -> list[str]:
    """A header block's lines, the status line first. Decoded once: CR, LF and ':' are ASCII,
    so no UTF-8 sequence spans them and the text splits as the bytes would."""
    return raw.decode("utf-8", "replace").split("\r\n")


def values_of(lines: list[str]) -> dict[str, list[str]]:
    """``{name: [values]}`` of header lines (lines without a ':' are skipped)."""
    values: dict[str, list[str]] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip()
            found = values.get(key)
            if found is None:
                values[key] = [value.strip()]
            else:
                found.append(value.strip())
    return values


def parse_b64(encoded: str | None) -> HeaderBlock:
    return parse(base64.b64decode(encoded)) if encoded else HeaderBlock()


def from_nats_py(headers: dict[str, str] | None) -> dict[str, list[str]]:
    """nats-py's folded header dict, in the API's ``{name: [values]}`` form."""
    if not headers:
        return {}
    return {name: [value] for name, value in headers.items() if name not in _NATS_PY_STATUS_KEYS}


# nats-py stores the status line of a header block under these pseudo header names.
_NATS_PY_STATUS_KEYS = frozenset({"Status", "Description"})


# -- nats-py's header dict, from the raw block ---------------------------------------------------
#
# Direct Get batches are read off the connection raw (app.nats.direct), not through nats-py's
# message path, but their answers carry the headers as nats-py made them of the block: one
# value per name (the last of a repeated name), names skipped when they are not ASCII or hold
# whitespace, the status line's code and text under "Status" and "Description". These
# functions make that same dict (nats-py 2.16's ``Client._process_headers`` and
# ``_parse_header_lines``; tests/unit/test_headers_folded.py compares them on generated blocks).

_SPACE = 0x20
_SKIPPED = " "  # (never a key: a key holds no whitespace)
_NAMES: dict[bytes, str] = {}  # header names read so far, as nats-py keys them, or _SKIPPED
_MAX_NAMES = 1024


def folded(raw: bytes | None) -> dict[str, str]:
    """The header dict nats-py makes of a header block (empty for none)."""
    if not raw:
        return {}
    if len(raw) > 8 and raw[8] == _SPACE:
        return _folded_status(raw)
    if len(raw) <= 10:
        return {}
    return _folded_lines(raw[10:])


def _folded_lines(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    names = _NAMES
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = names.get(name)
        if key is None:
            key = _key(name)
            if len(names) >= _MAX_NAMES:
                names.clear()
            names[name] = key
        if key is not _SKIPPED:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def _key(name: bytes) -> str:
    """A header name as nats-py keys it, or _SKIPPED for one it skips."""
    try:
        key = name.strip().decode("ascii")
    except UnicodeDecodeError:
        return _SKIPPED
    return _SKIPPED if any(c.isspace() for c in key) else key


def _folded_status(raw: bytes) -> dict[str, str]:
    """A block whose first line carries a status: ``NATS/1.0 204 EOB\\r\\n...``."""
    out: dict[str, str] = {}
    line = raw[9:]
    code = line[:3].strip().decode("utf-8", "replace")
    if code.isdigit():
        out["Status"] = code
    description = line[4 : len(line) - 4]
    if description:
        end = description.find(b"\r\n")
        if end > 0:
            out["Description"] = description[:end].decode("utf-8", "replace")
            out.update(_folded_lines(description[end + 2 :]))
        else:
            out["Description"] = description.decode("utf-8", "replace")
    rest = raw[8:]
    rest = rest[rest.find(b"\r\n") + 2 :]
    if len(rest) > 2:
        out.update(_folded_lines(raw[10:]))
    return out
