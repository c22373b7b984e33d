from __future__ import annotations

import pytest

from app import errors
from app.nats import features


def test_releases_are_read_from_versions() -> None:
    assert features.release("2.10.26") == (2, 10)
    assert features.release("v2.12.0-RC.1") == (2, 12)
    assert features.release("") is None
    assert features.release(None) is None


def test_what_each_release_lacks() -> None:
    assert features.missing("2.15.1") == []
    assert [item["feature"] for item in features.missing("2.12.8")] == [
        features.REPEATING_SCHEDULES.name
    ]
    assert features.missing("2.14.6") == []
    on_211 = [item["feature"] for item in features.missing("2.11.11")]
    assert on_211 == [
        "the prioritized priority policy",
        "atomic batch publishing",
        "message counters",
        "message schedules",
        features.REPEATING_SCHEDULES.name,
    ]
    assert len(features.missing("2.10.26")) == len(features.FEATURES)
    assert features.missing("unknown") == []


def test_what_a_config_uses() -> None:
    assert features.of_stream({"allow_msg_ttl": True, "allow_atomic": False}) == [
        features.MESSAGE_TTL
    ]
    assert features.of_stream({"subject_delete_marker_ttl": 5, "allow_msg_counter": True}) == [
        features.MESSAGE_TTL,
        features.COUNTERS,
    ]
    assert features.of_consumer({"priority_policy": "none"}) == []
    assert features.of_consumer({"priority_policy": "overflow"}) == [features.PRIORITY_GROUPS]
    assert features.of_consumer({"priority_policy": "prioritized", "pause_until": "x"}) == [
        features.PRIORITY_GROUPS,
        features.PRIORITIZED,
        features.CONSUMER_PAUSE,
    ]


def test_a_feature_newer_than_the_server_is_501_naming_both() -> None:
    features.require("2.12.0", features.PRIORITIZED)
    features.require(None, features.PRIORITIZED)  # unknown: the server's answer decides
    with pytest.raises(errors.FeatureUnsupported) as raised:
        features.require("2.11.11", features.PRIORITIZED)
    problem = raised.value.problem()
    assert problem["status"] == 501 and problem["code"] == "nats.feature_unsupported"
    assert problem["detail"] == (
        "the prioritized priority policy needs nats-server 2.12+; the NATS server is 2.11.11"
    )


def test_releases_before_2_14_refuse_copied_rollups() -> None:
    assert features.refuses_copied_rollups("2.10.26")
    assert features.refuses_copied_rollups("2.12.8")
    assert not features.refuses_copied_rollups("2.14.0")
    assert not features.refuses_copied_rollups("2.15.1")
    assert features.refuses_copied_rollups(None)  # unknown: what works on every release
