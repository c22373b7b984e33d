"""Every answer a test gets through the gateway's client has a status its operation documents.

A client generated from the spec reads only the statuses an operation lists; any other comes
back unparsed. The fuzzer (tests/contract) checks this for the requests it makes up; this
hook checks it for every request the integration tests make, which reach the states the
fuzzer does not (a missing origin, a consumer mid-pull, a bucket being deleted).

Not checked: paths no operation of the spec takes (404 by design), methods a path does not
have (405, and OPTIONS), and what the HTTP layer answers before any route is matched (a head
too large, 431).

With ``JSGW_SPEC_STATUSES_LOG`` set to a file, each such answer is appended to it instead of
failing the request: to survey a whole run at once.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import httpx

SPEC = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"
_BEFORE_ROUTING = {431}
_COLLECT = os.environ.get("JSGW_SPEC_STATUSES_LOG")  # append findings here instead of failing


@functools.cache
def _operations() -> list[tuple[re.Pattern[str], int, dict[str, Any]]]:
    """(path regex, literal characters, operations by method), most literal first."""
    spec = json.loads(SPEC.read_text())
    out = []
    for template, item in spec["paths"].items():
        parts = re.split(r"(\{[^}]+\})", template)
        pattern = "".join(
            "[^/]+" if part.startswith("{") else re.escape(part) for part in parts if part
        )
        literal = sum(len(part) for part in parts if not part.startswith("{"))
        out.append((re.compile(pattern), literal, item))
    out.sort(key=lambda entry: -entry[1])
    return out


def undocumented(method: str, path: str, status: int) -> str | None:
    """Why this answer is not in the spec, or None when it is (or is not checked)."""
    if status in _BEFORE_ROUTING or method == "OPTIONS":
        return None
    for pattern, _, item in _operations():
        if pattern.fullmatch(path):
            operation = item.get(method.lower())
            if operation is None:
                return None  # a 405 (or a HEAD the route answers as its GET)
            responses = operation.get("responses", {})
            if str(status) in responses or f"{status // 100}XX" in responses:
                return None
            if "default" in responses:
                return None
            return (
                f"{method} {path} answered {status}, which operation "
                f"{operation.get('operationId')} does not document (it lists "
                f"{', '.join(sorted(responses))})"
            )
    return None


async def check_documented(response: httpx.Response) -> None:
    """An httpx response hook: fails the request whose status its operation does not list."""
    request = response.request
    problem = undocumented(request.method, request.url.path, response.status_code)
    if problem is None:
        return
    await response.aread()
    if not _COLLECT:
        raise AssertionError(f"{problem}: {response.text[:500]}")
    with open(_COLLECT, "a") as log:
        log.write(f"{problem}\t{response.text[:300]}\n")
