"""What each nats-server release offers of what the gateway uses beyond KV's own operations.

The gateway supports nats-server 2.10 for KV (get, get at a revision, history, keys, watch,
consistent multi-key reads, create/update/delete) and object buckets, and 2.11+ for the
rest. A request that needs a newer release than the connected server's is answered 501
``nats.feature_unsupported`` naming the release, before anything is sent: an older server
would take most of these requests and quietly ignore what it does not know (a stream
setting, a consumer's priority groups, a message's TTL). At start-up the gateway logs what
the server lacks, and ``/v1/info`` shows it.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from app import errors


class Feature(NamedTuple):
    name: str  # in the words the API documentation uses
    since: tuple[int, int]  # the first release that has it

    @property
    def needs(self) -> str:
        return f"nats-server {self.since[0]}.{self.since[1]}+"


BATCH_DIRECT_GET = Feature("batched Direct Get (batch, multi_last, up_to_seq/up_to_time)", (2, 11))
PRIORITY_GROUPS = Feature("pull consumer priority groups (overflow, pinned_client, unpin)", (2, 11))
PRIORITIZED = Feature("the prioritized priority policy", (2, 12))
MESSAGE_TTL = Feature("per-message TTL and KV limit markers", (2, 11))
CONSUMER_PAUSE = Feature("consumer pause", (2, 11))
ATOMIC_BATCH = Feature("atomic batch publishing", (2, 12))
COUNTERS = Feature("message counters", (2, 12))
SCHEDULES = Feature("message schedules", (2, 12))
# 2.12 takes "@at <time>" schedules with a target and a TTL only: any other pattern is
# refused as invalid, and the other headers are stored without a word.
REPEATING_SCHEDULES = Feature(
    "repeating message schedules (@every, cron, @hourly and the like) and "
    "Nats-Schedule-Time-Zone, -Rollup and -Source",
    (2, 14),
)

FEATURES: tuple[Feature, ...] = (
    BATCH_DIRECT_GET,
    PRIORITY_GROUPS,
    PRIORITIZED,
    MESSAGE_TTL,
    CONSUMER_PAUSE,
    ATOMIC_BATCH,
    COUNTERS,
    SCHEDULES,
    REPEATING_SCHEDULES,
)

# Stream settings an older server would drop without a word, and what they belong to.
STREAM_SETTINGS: dict[str, Feature] = {
    "allow_msg_ttl": MESSAGE_TTL,
    "subject_delete_marker_ttl": MESSAGE_TTL,
    "allow_atomic": ATOMIC_BATCH,
    "allow_msg_counter": COUNTERS,
    "allow_msg_schedules": SCHEDULES,
}

# The first release that stores a roll-up (a KV purge) copied into a mirror or sourced into a
# stream whatever that stream allows. Before it, a copying stream that denies purges or
# roll-ups refuses the copy as it would refuse such a publish ("rollup not permitted", in the
# server's log only), and its mirror or source stops there for good.
COPIED_ROLLUPS = (2, 14)

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
        {"feature": feature.name, "needs": feature.needs}
        for feature in FEATURES
        if have < feature.since
    ]


def refuses_copied_rollups(version: str | None) -> bool:
    """Does the server of ``version`` refuse the roll-ups a mirror or a source copies into a
    stream that denies them (:data:`COPIED_ROLLUPS`)? An unknown version is taken as one that
    does: the config this decides is kept for good (the server never turns deny_purge off),
    and the one for such a server works on every release."""
    have = release(version)
    return have is None or have < COPIED_ROLLUPS


def require(version: str | None, feature: Feature) -> None:
    """Raise 501 ``nats.feature_unsupported`` when the server of ``version`` predates
    ``feature`` (an unknown version passes: the server's answer decides then)."""
    have = release(version)
    if have is not None and have < feature.since:
        raise errors.FeatureUnsupported(
            detail=f"{feature.name} needs {feature.needs}; the NATS server is {version}",
        )


def of_stream(config: dict[str, Any]) -> list[Feature]:
    """The features a stream config (NATS's field names) turns on."""
    return [feature for setting, feature in STREAM_SETTINGS.items() if config.get(setting)]


def of_consumer(config: dict[str, Any]) -> list[Feature]:
    """The features a consumer config (NATS's field names) uses."""
    policy = config.get("priority_policy") or "none"
    used = [] if policy == "none" else [PRIORITY_GROUPS]
    if policy == "prioritized":
        used.append(PRIORITIZED)
    if config.get("pause_until"):
        used.append(CONSUMER_PAUSE)
    return used
