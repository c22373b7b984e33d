"""HTTP byte ranges (RFC 9110 §14) of an object: one range is served, others are not.

``Range`` headers that are not one well-formed ``bytes`` range are ignored (the whole object
is served, as RFC 9110 allows); a well-formed one that starts past the end is unsatisfiable.
"""

from __future__ import annotations

import re

from app import errors
from app.errors import ErrorCode
from app.obj.service import Span

_ONE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def span_of(header: str | None, size: int) -> Span | None:
    """The bytes a ``Range`` header asks for (None: the whole object), or 416."""
    if header is None:
        return None
    found = _ONE.match(header)
    if found is None:
        return None
    first, last = found.group(1), found.group(2)
    if not first and not last:
        return None
    if not first:  # a suffix: the last N bytes
        count = int(last)
        if count == 0 or size == 0:
            raise unsatisfiable(size)
        return Span(max(0, size - count), size - 1)
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None  # invalid: ignored
    if start >= size:
        raise unsatisfiable(size)
    return Span(start, min(end, size - 1))


def unsatisfiable(size: int) -> errors.GatewayError:
    return errors.RangeNotSatisfiable(
        ErrorCode.OBJ_RANGE_NOT_SATISFIABLE,
        f"the object has {size} bytes",
        headers={"Content-Range": f"bytes */{size}"},
    )
