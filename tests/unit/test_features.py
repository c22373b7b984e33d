from __future__ import annotations

from app.nats import features


def test_releases_are_read_from_versions() -> None:
    assert features.release("2.10.26") == (2, 10)
    assert features.release("v2.12.0-RC.1") == (2, 12)
    assert features.release("") is None
    assert features.release(None) is None


def test_what_each_release_lacks() -> None:
    assert features.missing("2.15.1") == []
    assert features.missing("2.12.8") == []
    on_211 = [item["feature"] for item in features.missing("2.11.11")]
    assert on_211 == [
        "the prioritized priority policy",
        "atomic batch publishing",
        "message counters",
        "message schedules",
    ]
    assert len(features.missing("2.10.26")) == len(features.FEATURES)
    assert features.missing("unknown") == []
