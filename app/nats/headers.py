"""NATS header blocks (``NATS/1.0 <status> <description>`` + MIME-style lines).

nats-py folds repeated header names into one value; the gateway keeps every value, since a
stored message may carry several, so it parses the raw block where it has one.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

_PREFIX = b"NATS/1.0"


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
    block = HeaderBlock()
    if not raw:
        return block
    lines = raw.split(b"\r\n")
    first = lines[0]
    if first.startswith(_PREFIX):
        rest = first[len(_PREFIX) :].strip()
        if rest:
            status, _, description = rest.partition(b" ")
            if status.isdigit():
                block.status = int(status)
                block.description = description.decode("utf-8", "replace").strip()
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.decode("utf-8", "replace").strip()
        block.values.setdefault(key, []).append(value.decode("utf-8", "replace").strip())
    return block


def parse_b64(encoded: str | None) -> HeaderBlock:
    return parse(base64.b64decode(encoded)) if encoded else HeaderBlock()


def from_nats_py(headers: dict[str, str] | None) -> dict[str, list[str]]:
    """nats-py's folded header dict, in the API's ``{name: [values]}`` form."""
    if not headers:
        return {}
    return {name: [value] for name, value in headers.items() if name not in _NATS_PY_STATUS_KEYS}


# nats-py stores the status line of a header block under these pseudo header names.
_NATS_PY_STATUS_KEYS = frozenset({"Status", "Description"})
