"""The KV model without a server: names, operations, entity tags, the ADR-8 stream config."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import errors
from app.kv import model as kv_model
from app.kv.keys import parse_cursor
from app.kv.model import ANY_REVISION, Precondition
from app.kv.schemas import KVConfig
from app.kv.service import ttl_header
from app.kv.watch import WatchOptions
from app.nats.direct import StoredMessage
from app.streams.schemas import Placement, Republish


def test_names_and_subjects() -> None:
    assert kv_model.stream_name("USERS") == "KV_USERS"
    assert kv_model.key_subject("USERS", "1234.name") == "$KV.USERS.1234.name"
    assert kv_model.filter_subject("USERS", "1234.>") == "$KV.USERS.1234.>"
    assert kv_model.key_of("USERS", "$KV.USERS.1234.name") == "1234.name"
    assert kv_model.bucket_of_stream("KV_USERS") == "USERS"
    assert kv_model.bucket_of_stream("ORDERS") is None
    for subject in ("$KV.OTHER.a", "$KV.USERS.", "$KV.USERSX.a"):
        with pytest.raises(ValueError):
            kv_model.key_of("USERS", subject)


@pytest.mark.parametrize(
    ("headers", "operation"),
    [
        (None, "PUT"),
        ({}, "PUT"),
        ({"KV-Operation": "DEL"}, "DEL"),
        ({"KV-Operation": ["PURGE"], "Nats-Rollup": ["sub"]}, "PURGE"),
        ({"Nats-Marker-Reason": "MaxAge"}, "PURGE"),
        ({"Nats-Marker-Reason": ["Purge"]}, "PURGE"),
        ({"Nats-Marker-Reason": "Remove"}, "DEL"),
        ({"Nats-Marker-Reason": "SomethingNew"}, "DEL"),
        ({"KV-Operation": "PUT"}, "PUT"),
        ({"X-Other": "DEL"}, "PUT"),
    ],
)
def test_operation_of(headers: dict | None, operation: str) -> None:
    assert kv_model.operation_of(headers) == operation


def test_times_are_written_like_nats_writes_them() -> None:
    # Go's RFC3339Nano trims trailing zeros; Nats-Time-Stamp and watch entries must agree.
    assert kv_model.time_from_ns(1_795_357_827_810_762_591) == "2026-11-22T14:30:27.810762591Z"
    assert kv_model.time_from_ns(1_795_357_827_810_000_000) == "2026-11-22T14:30:27.81Z"
    assert kv_model.time_from_ns(1_795_357_827_000_000_000) == "2026-11-22T14:30:27Z"


def test_entry_json_from_a_stored_message() -> None:
    message = StoredMessage("KV_B", "$KV.B.a.b", 7, "2026-01-01T00:00:00.5Z", {}, b"\x00hi")
    entry = kv_model.entry_from_message("B", message, delta=2)
    assert entry.to_json() == {
        "bucket": "B",
        "key": "a.b",
        "value": base64.b64encode(b"\x00hi").decode(),
        "revision": 7,
        "created": "2026-01-01T00:00:00.5Z",
        "delta": 2,
        "operation": "PUT",
    }
    meta = kv_model.Entry("B", "k", 1, None, "DEL", None).to_json()
    assert "value" not in meta and "delta" not in meta


@pytest.mark.parametrize(
    ("if_match", "if_none_match", "expected"),
    [
        (None, None, Precondition()),
        (None, "*", Precondition(create=True)),
        (None, " * ", Precondition(create=True)),
        ('"12"', None, Precondition(revision=12)),
        ("12", None, Precondition(revision=12)),
        ("*", None, Precondition(revision=ANY_REVISION)),
    ],
)
def test_preconditions(
    if_match: str | None, if_none_match: str | None, expected: Precondition
) -> None:
    assert Precondition.from_headers(if_match, if_none_match) == expected


@pytest.mark.parametrize(
    ("if_match", "if_none_match", "code"),
    [
        ('"0"', None, "kv.revision_invalid"),
        ('"-1"', None, "kv.revision_invalid"),
        ('W/"3"', None, "kv.revision_invalid"),
        ('"1", "2"', None, "kv.revision_invalid"),
        ('"abc"', None, "kv.revision_invalid"),
        ('"1e3"', None, "kv.revision_invalid"),
        ('"３"', None, "kv.revision_invalid"),  # a full-width digit is not a revision
        (f'"{2**64}"', None, "kv.revision_invalid"),
        ("", None, "kv.revision_invalid"),
        (None, '"3"', "kv.precondition_invalid"),
        ('"3"', "*", "kv.precondition_invalid"),
    ],
)
def test_bad_preconditions(if_match: str | None, if_none_match: str | None, code: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        Precondition.from_headers(if_match, if_none_match)
    assert caught.value.code == code


# Entity tags take revisions of up to 19 digits (app.validation.REVISION_DIGITS): a stream
# reaches 10^19 messages no sooner than in 300,000 years at a million a second.
@given(st.integers(min_value=1, max_value=10**19 - 1))
def test_revision_tags_round_trip(revision: int) -> None:
    assert Precondition.from_headers(kv_model.etag(revision), None).revision == revision
    assert kv_model.if_none_match_hits(kv_model.etag(revision), revision)
    assert kv_model.if_none_match_hits(f'"1", W/{kv_model.etag(revision)}', revision)
    assert not kv_model.if_none_match_hits(kv_model.etag(revision), revision + 1)


def test_if_none_match() -> None:
    assert kv_model.if_none_match_hits("*", 5)
    assert not kv_model.if_none_match_hits(None, 5)
    assert not kv_model.if_none_match_hits('"x"', 5)


def test_stream_config_is_adr8s() -> None:
    config = KVConfig(
        history=5,
        ttl="90s",
        max_value_size=1024,
        max_bytes=1 << 20,
        storage="memory",
        compression=True,
        description="d",
        placement=Placement(cluster="c", tags=["t"]),
        republish=Republish(src="$KV.B.>", dest="repub.>", headers_only=True),
    )
    body = kv_model.stream_config("B", config, None)
    assert body == {
        "name": "KV_B",
        "subjects": ["$KV.B.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": 5,
        "max_msgs": -1,
        "max_bytes": 1 << 20,
        "max_age": 90_000_000_000,
        "max_msg_size": 1024,
        "storage": "memory",
        "discard": "new",
        "num_replicas": 1,
        "duplicate_window": 90_000_000_000,  # ttl under 2 minutes: the same as max_age
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "allow_direct": True,
        "compression": "s2",
        "description": "d",
        "placement": {"cluster": "c", "tags": ["t"]},
        "republish": {"src": "$KV.B.>", "dest": "repub.>", "headers_only": True},
    }


def test_duplicate_window_and_limit_markers() -> None:
    assert kv_model.stream_config("B", KVConfig(), None)["duplicate_window"] == 120_000_000_000
    long_ttl = kv_model.stream_config("B", KVConfig(ttl="1h"), None)
    assert long_ttl["duplicate_window"] == 120_000_000_000 and long_ttl["max_age"] == 3600 * 10**9
    markers = kv_model.stream_config("B", KVConfig(limit_marker_ttl="5s"), None)
    assert markers["allow_msg_ttl"] is True
    assert markers["subject_delete_marker_ttl"] == 5_000_000_000
    plain = kv_model.stream_config("B", KVConfig(), None)
    assert "allow_msg_ttl" not in plain and "subject_delete_marker_ttl" not in plain
    # The server refuses to switch message TTLs off again (nats-py turns them on always).
    kept = kv_model.stream_config("B", KVConfig(), {"allow_msg_ttl": True})
    assert kept["allow_msg_ttl"] is True


def test_status_from_stream_info() -> None:
    info = {
        "config": {
            "name": "KV_B",
            "max_msgs_per_subject": 3,
            "max_age": 1_500_000_000,
            "compression": "s2",
            "storage": "file",
            "num_replicas": 1,
            "max_msg_size": -1,
            "max_bytes": -1,
            "allow_direct": True,
            "subject_delete_marker_ttl": 2_000_000_000,
            "description": "x",
        },
        "state": {"messages": 9, "bytes": 100, "last_seq": 12},
        "created": "2026-01-01T00:00:00Z",
    }
    status = kv_model.status_from_info(info)
    assert status["bucket"] == "B" and status["backing_store"] == "JetStream"
    assert (status["values"], status["history"], status["ttl"], status["bytes"]) == (9, 3, 1.5, 100)
    assert status["is_compressed"] is True and status["limit_marker_ttl"] == 2
    assert status["last_revision"] == 12 and status["description"] == "x"


@pytest.mark.parametrize(
    "bad",
    [
        {"history": 0},
        {"history": 65},
        {"max_value_size": 0},
        {"limit_marker_ttl": "500ms"},
        {"ttl": "soon"},
        {"ttl": -1},
        {"ttl": "99ms"},
        {"ttl": 1e-9},
        {"replicas": 6},
        {"storage": "disk"},
        {"bucket": "B"},
    ],
)
def test_bad_bucket_configs(bad: dict) -> None:
    with pytest.raises(ValueError):
        KVConfig(**bad)


def test_ttl_header() -> None:
    assert ttl_header("2") == "2s"
    assert ttl_header("1m") == "60s"
    assert ttl_header("1.5s") == "1500ms"
    assert ttl_header("never") == "never"
    # The header value is written by the gateway, never copied from the request.
    assert ttl_header(" 3s\n") == "3s"
    for bad in ("0.5", "500ms", "soon", "-1", "1s\r\nX-Injected: 1"):
        with pytest.raises(errors.InvalidInput):
            ttl_header(bad)


def test_cursor() -> None:
    assert parse_cursor(None) == 0
    assert parse_cursor("") == 0
    assert parse_cursor("42") == 42
    for bad in ("-1", "x", "1.5", "4\n", str(2**64), "٣"):
        with pytest.raises(errors.InvalidInput):
            parse_cursor(bad)


def _watch(**options: object) -> WatchOptions:
    values: dict = {
        "history": False,
        "ignore_deletes": False,
        "meta_only": False,
        "updates_only": False,
        "since": None,
        "last_event_id": None,
    }
    values.update(options)
    return WatchOptions.parse(values.pop("key", None), **values)


def test_watch_options_pick_the_deliver_policy() -> None:
    assert _watch().consumer("B", 5).deliver_policy == "last_per_subject"
    assert _watch().consumer("B", 5).filter_subject == "$KV.B.>"
    assert _watch(key="a.*").consumer("B", 5).filter_subject == "$KV.B.a.*"
    assert _watch(history=True).consumer("B", 5).deliver_policy == "all"
    assert _watch(updates_only=True).consumer("B", 5).deliver_policy == "new"
    assert _watch(meta_only=True).consumer("B", 5).headers_only is True
    resumed = _watch(since=10, updates_only=True).consumer("B", 5)
    assert (resumed.deliver_policy, resumed.start_seq) == ("by_start_sequence", 11)
    # Last-Event-ID (a browser reconnecting) wins over the since= of the URL it reuses.
    assert _watch(since=10, last_event_id="25").since == 25
    assert _watch(last_event_id="0").consumer("B", 5).start_seq == 1


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"history": True, "updates_only": True}, "kv.watch_invalid"),
        ({"last_event_id": "abc"}, "kv.last_event_id_invalid"),
        ({"last_event_id": "-3"}, "kv.last_event_id_invalid"),
        ({"key": "a.>.b"}, "kv.key_filter_invalid"),
        ({"key": "a b"}, "kv.key_filter_invalid"),
        ({"key": "a.\n"}, "kv.key_filter_invalid"),
        ({"key": ".a"}, "kv.key_filter_invalid"),
    ],
)
def test_bad_watch_options(options: dict, code: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        _watch(**options)
    assert caught.value.code == code


def test_an_aggregates_sources_keep_key_names_and_read_back_as_its_origins() -> None:
    config = KVConfig.model_validate(
        {
            "aggregate": {
                "origins": [
                    {"bucket": "ORDERS", "keys": ["NEW.*.*", "OLD.>"]},
                    {"bucket": "USERS", "stream": "USERS_NYC", "external": {"api": "$JS.hub.API"}},
                ]
            }
        }
    )
    body = kv_model.stream_config("AGG", config, None)
    assert body["subjects"] == [] and body["deny_purge"] and "allow_rollup_hdrs" not in body
    orders, users = body["sources"]
    assert orders == {
        "name": "KV_ORDERS",
        "subject_transforms": [
            {"src": "$KV.ORDERS.NEW.*.*", "dest": "$KV.AGG.NEW.{{wildcard(1)}}.{{wildcard(2)}}"},
            {"src": "$KV.ORDERS.OLD.>", "dest": "$KV.AGG.OLD.>"},
        ],
    }
    assert users["name"] == "USERS_NYC" and users["external"] == {"api": "$JS.hub.API"}
    assert users["subject_transforms"] == [{"src": "$KV.USERS.>", "dest": "$KV.AGG.>"}]
    assert kv_model.is_read_only(body)
    view = kv_model.aggregate_view("KV_AGG", body, [{"name": "KV_ORDERS", "lag": 3, "active": 0}])
    assert view == {
        "writable": False,
        "origins": [
            {
                "stream": "KV_ORDERS",
                "bucket": "ORDERS",
                "keys": ["NEW.*.*", "OLD.>"],
                "lag": 3,
                "active": 0,
            },
            {"stream": "USERS_NYC", "bucket": "USERS", "external": {"api": "$JS.hub.API"}},
        ],
    }
    # Settings changed without `aggregate`: the origins stay; writable keeps its subjects.
    again = kv_model.stream_config("AGG", KVConfig(history=3), body)
    assert again["sources"] == body["sources"] and again["subjects"] == []
    writable = KVConfig.model_validate(
        {"aggregate": {"writable": True, "origins": [{"bucket": "ORDERS"}]}}
    )
    body = kv_model.stream_config("AGG", writable, None)
    assert body["subjects"] == ["$KV.AGG.>"] and body["allow_rollup_hdrs"] is True
    assert not kv_model.is_read_only(body)


def test_a_copy_takes_rollups_unless_it_already_denies_purges() -> None:
    mirror = {"name": "M", "deny_delete": True, "deny_purge": True, "mirror": {"name": "KV_b"}}
    taking = kv_model.taking_copied_rollups(mirror, None)
    assert taking["allow_rollup_hdrs"] is True and "deny_purge" not in taking
    assert taking["deny_delete"] is True and mirror["deny_purge"] is True  # (a copy)
    # The server never turns deny_purge off: an existing copy keeps it.
    assert kv_model.taking_copied_rollups(mirror, {"deny_purge": True}) == mirror
