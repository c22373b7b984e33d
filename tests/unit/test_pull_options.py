from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import errors, validation
from app.config import Settings
from app.consumers import config as consumer_config
from app.consumers import pull_options
from app.consumers.schemas import ConsumeQuery, ConsumerConfig, FetchRequest, NextRequest
from app.nats.pull import BIG_BATCH

S = 1_000_000_000
SETTINGS = Settings(nats_url=["nats://127.0.0.1:1"])
PINNED = {"priority_groups": ["jobs"], "priority_policy": "pinned_client"}


def test_fetch_defaults() -> None:
    request = pull_options.fetch_request(FetchRequest(), SETTINGS, None)
    assert (request.batch, request.max_bytes, request.expires_ns, request.heartbeat_ns) == (
        1,
        0,
        5 * S,
        0,
    )
    # ADR-37: heartbeats by default when expires > 30 s.
    long = pull_options.fetch_request(FetchRequest(expires="2m"), SETTINGS, None)
    assert long.heartbeat_ns == 5 * S
    # no_wait without expires: answered at once by the server.
    assert pull_options.fetch_request(NextRequest(no_wait=True), SETTINGS, None).expires_ns == 0


def test_fetch_by_bytes_asks_for_many_messages() -> None:
    request = pull_options.fetch_request(FetchRequest(max_bytes=4096), SETTINGS, None)
    assert (request.batch, request.max_bytes) == (SETTINGS.max_fetch_messages, 4096)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"max_messages": 1, "max_bytes": 1}, "consumer.fetch_invalid"),
        ({"max_messages": 1001}, "consumer.fetch_invalid"),
        ({"expires": 0.999}, "consumer.expires_invalid"),
        ({"expires": 301}, "consumer.expires_invalid"),
        ({"idle_heartbeat": 0.4}, "consumer.heartbeat_invalid"),
        ({"idle_heartbeat": 31, "expires": 100}, "consumer.heartbeat_invalid"),
        ({"idle_heartbeat": 3, "expires": 5}, "consumer.heartbeat_invalid"),
        ({"min_ack_pending": 1}, "consumer.group_options"),
        ({"priority": 0}, "consumer.group_options"),
    ],
)
def test_fetch_refusals(body: dict, code: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        pull_options.fetch_request(FetchRequest(**body), SETTINGS, None)
    assert refused.value.code == code


@pytest.mark.parametrize("pin", ["", "a" * 65, "a\r\nb", "a b", "a\n"])
def test_pin_ids_are_checked(pin: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        pull_options.fetch_request(FetchRequest(group="jobs"), SETTINGS, pin)
    assert refused.value.code == "consumer.pin_id_invalid"


def test_consume_defaults_follow_adr37() -> None:
    options = pull_options.consume_options(ConsumeQuery(), SETTINGS, None, {})
    assert (options.max_messages, options.threshold_messages, options.max_bytes) == (100, 50, 0)
    assert options.template.expires_ns == 30 * S
    assert options.template.heartbeat_ns == 15 * S  # half of expires, at most 30 s
    one = pull_options.consume_options(ConsumeQuery(max_messages=1, expires=1), SETTINGS, None, {})
    assert (one.threshold_messages, one.template.heartbeat_ns) == (0, S // 2)
    by_bytes = pull_options.consume_options(
        ConsumeQuery(max_bytes=10_000), SETTINGS, None, {"max_batch": 50}
    )
    assert (by_bytes.max_messages, by_bytes.threshold_bytes, by_bytes.bytes_batch) == (0, 5000, 50)
    unbounded = pull_options.consume_options(ConsumeQuery(max_bytes=10), SETTINGS, None, {})
    assert unbounded.bytes_batch == BIG_BATCH


@pytest.mark.parametrize(
    ("query", "config", "pin", "code"),
    [
        ({"max_messages": 10}, {"max_batch": 5}, None, "consumer.max_batch_exceeded"),
        ({"expires": 20}, {"max_expires": 10 * S}, None, "consumer.max_expires_exceeded"),
        ({"max_bytes": 2000}, {"max_bytes": 1000}, None, "consumer.max_bytes_exceeded"),
        ({}, PINNED, None, "consumer.group_required"),
        ({"group": "other"}, PINNED, None, "consumer.group_invalid"),
        ({"group": "jobs"}, {}, None, "consumer.group_invalid"),
        ({"group": "jobs", "min_pending": 5}, PINNED, None, "consumer.not_overflow"),
        (
            {"group": "jobs"},
            {"priority_groups": ["jobs"], "priority_policy": "overflow"},
            "PIN",
            "consumer.not_pinned_client",
        ),
        ({"max_messages": 4, "threshold_messages": 5}, {}, None, "consumer.consume_invalid"),
        ({"idle_heartbeat": 0}, {}, None, "consumer.heartbeat_invalid"),
    ],
)
def test_consume_is_checked_against_the_consumer(
    query: dict, config: dict, pin: str | None, code: str
) -> None:
    with pytest.raises(errors.GatewayError) as refused:
        pull_options.consume_options(ConsumeQuery(**query), SETTINGS, pin, config)
    assert refused.value.code == code
    # Refused for what the consumer is: 409; for what the request is: 400.
    intrinsic = ("consumer.consume_invalid", "consumer.heartbeat_invalid")
    assert refused.value.status == (400 if code in intrinsic else 409)


def test_push_consumers_cannot_be_pulled() -> None:
    with pytest.raises(errors.Conflict):
        pull_options.consume_options(ConsumeQuery(), SETTINGS, None, {"deliver_subject": "x"})


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"priority_groups": ["jobs"]}, "consumer.priority_policy_required"),
        ({"priority_timeout": 1}, "consumer.priority_policy_required"),
        ({"priority_policy": "overflow"}, "consumer.priority_groups_required"),
        (
            {"priority_policy": "overflow", "priority_groups": ["a", "a"]},
            "consumer.group_name_invalid",
        ),
        ({**PINNED, "ack_policy": "all"}, "consumer.explicit_ack_required"),
        ({"name": "other"}, "consumer.name_mismatch"),
    ],
)
def test_adr42_config_rules(config: dict, code: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        consumer_config.to_nats("C", ConsumerConfig(**config))
    assert refused.value.code == code


def test_config_to_nats_is_durable_and_in_nanoseconds() -> None:
    body = consumer_config.to_nats(
        "C", ConsumerConfig(**PINNED, priority_timeout="1m30s", backoff=[1, "1.5s"])
    )
    assert body["durable_name"] == body["name"] == "C"
    assert body["ack_policy"] == "explicit"
    assert body["priority_timeout"] == 90 * S
    assert body["backoff"] == [S, 1_500_000_000]


def test_info_out_uses_seconds_and_the_servers_group_state() -> None:
    out = consumer_config.consumer_info_out(
        {
            "stream_name": "S",
            "name": "C",
            "created": "2026-01-01T00:00:00.1Z",
            "config": {
                "ack_wait": 30 * S,
                "backoff": [S, 2 * S],
                "priority_timeout": 1_500_000_000,
            },
            "delivered": {
                "consumer_seq": 1,
                "stream_seq": 2,
                "last_active": "2026-01-01T00:00:01Z",
            },
            "ack_floor": {"consumer_seq": 0, "stream_seq": 0},
            "priority_groups": [
                {"group": "jobs", "pinned_client_id": "P", "pinned_ts": "2026-01-01T00:00:02Z"},
                {"group": "idle", "pinned_ts": "0001-01-01T00:00:00Z"},
            ],
        }
    )
    assert out["config"] == {"ack_wait": 30, "backoff": [1, 2], "priority_timeout": 1.5}
    assert out["priority_groups"] == [
        {"group": "jobs", "pinned_client_id": "P", "pinned_ts": "2026-01-01T00:00:02Z"},
        {"group": "idle"},
    ]
    assert out["delivered"]["last_active"] == "2026-01-01T00:00:01Z"
    assert "last_active" not in out["ack_floor"]


@given(st.text(max_size=20))
def test_group_names_match_the_servers_rule(value: str) -> None:
    # nats-server: ^[a-zA-Z0-9/_=-]{1,16}$ (and no trailing newline sneaking through).
    valid = 1 <= len(value) <= 16 and all(
        c.isascii() and (c.isalnum() or c in "/_=-") for c in value
    )
    try:
        validation.group_name(value)
        accepted = True
    except errors.InvalidInput:
        accepted = False
    assert accepted is valid


@pytest.mark.parametrize(
    ("err_code", "status", "code"),
    [
        (10012, 409, "consumer.not_updatable"),
        (10149, 404, "consumer.not_found"),
        (10159, 400, "consumer.priority_groups_required"),
        (10160, 409, "consumer.group_invalid"),
        (10162, 400, "consumer.group_name_invalid"),
        (10178, 400, "consumer.priority_requires_pull"),
        (10196, 400, "consumer.priority_policy_required"),
        (10099, 409, "consumer.workqueue_overlap"),
    ],
)
def test_consumer_errors_map_by_err_code(err_code: int, status: int, code: str) -> None:
    error = errors.from_jetstream({"code": 500, "err_code": err_code, "description": "whatever"})
    assert (error.status, error.code) == (status, code)
