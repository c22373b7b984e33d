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
