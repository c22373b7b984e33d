"""What each nats-server release offers of what the gateway uses beyond KV's own operations.

The gateway supports nats-server 2.10 for KV (get, get at a revision, history, keys, watch,
create/update/delete) and 2.11+ for the rest. A request that needs a newer release is
answered 501 naming it, when the server's answer shows the feature is missing; this table
says in advance, at start-up (logged) and in ``/v1/info``, what the connected server lacks.
"""

from __future__ import annotations

import re

# (feature, the first release that has it), in the words the API documentation uses.
FEATURES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("batched Direct Get (batch, multi_last, up_to_seq/up_to_time)", (2, 11)),
    ("pull consumer priority groups (overflow, pinned_client, unpin)", (2, 11)),
    ("the prioritized priority policy", (2, 12)),
    ("per-message TTL and KV limit markers", (2, 11)),
    ("consumer pause", (2, 11)),
    ("atomic batch publishing", (2, 12)),
    ("message counters", (2, 12)),
    ("message schedules", (2, 12)),
)

_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def release(version: str | None) -> tuple[int, int] | None:
    """``"2.10.26"`` → ``(2, 10)``; None when the version is unknown or not a release."""
    match = _VERSION.match(version or "")
    return (int(match[1]), int(match[2])) if match else None


def missing(version: str | None) -> list[dict[str, str]]:
    """The features the server of ``version`` does not offer, each with the release it needs
    (nothing when the version is unknown: the server's answers say it then)."""
    have = release(version)
    if have is None:
        return []
    return [
        {"feature": feature, "needs": f"nats-server {major}.{minor}+"}
        for feature, (major, minor) in FEATURES
        if have < (major, minor)
    ]
