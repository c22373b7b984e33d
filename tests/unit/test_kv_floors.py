"""Revision floors: bounded, raised by what is seen, brought down only by the stream leader."""

from __future__ import annotations

from app.kv.floors import RevisionFloors


def test_a_floor_only_rises() -> None:
    floors = RevisionFloors()
    floors.advance("$KV.b.k", 5)
    floors.advance("$KV.b.k", 3)
    assert floors.revisions == {"$KV.b.k": 5}
    floors.advance("$KV.b.k", 0)
    assert floors.revisions == {"$KV.b.k": 5}


def test_the_key_raised_longest_ago_is_dropped_past_the_bound() -> None:
    floors = RevisionFloors(max_keys=3)
    for key in "abc":
        floors.advance(key, 1)
    floors.advance("a", 2)  # raised again: now the newest
    floors.advance("d", 1)
    assert list(floors.revisions) == ["c", "a", "d"]
    assert len(floors) == 3


def test_the_leaders_older_answer_replaces_the_floor_it_was_checked_against() -> None:
    floors = RevisionFloors()
    floors.advance("k", 9)
    floors.settle("k", 9, 4)  # the key went back (a purge by other means)
    assert floors.revisions == {"k": 4}
    floors.settle("k", 4, 0)  # no message at all
    assert floors.revisions == {}
    floors.settle("k", 0, 7)
    assert floors.revisions == {"k": 7}


def test_a_floor_raised_meanwhile_stands() -> None:
    floors = RevisionFloors()
    floors.advance("k", 9)
    floors.advance("k", 12)  # a write answered while the leader was asked
    floors.settle("k", 9, 4)
    assert floors.revisions == {"k": 12}
