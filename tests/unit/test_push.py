"""Push delivery without a server: the endpoint allowlist, what answers mean, Retry-After, the
request the application gets (headers, CloudEvents, batches), dead letters, the models, the
subscriptions file and the consumer a subscription needs."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg
from pydantic import ValidationError

from app import errors
from app.config import Settings
from app.nats import acks
from app.push import deadletter, mapping, outcome
from app.push.allowlist import Allowlist, EndpointError, parse_prefix
from app.push.declared import SubscriptionsFileError, load
from app.push.mapping import Delivery
from app.push.outcome import MAX_RETRY_AFTER, Kind
from app.push.runner import ConsumerTerms
from app.push.schemas import Subscription
from app.push.service import check_consumer, consumer_to_make

# -- the allowlist -------------------------------------------------------------------------

DEFAULT = Allowlist(["http://127.0.0.1", "http://localhost"])
NARROW = Allowlist(["http://localhost:8080/hooks", "https://app.internal/v1/"])


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1/hook",
        "http://127.0.0.1:3000/a/b?x=1",
        "http://127.0.0.1",
        "HTTP://LocalHost:9/Hook",
        "http://localhost/",
    ],
)
def test_the_default_allows_the_pods_own_application(endpoint: str) -> None:
    assert DEFAULT.allows(endpoint)
    assert DEFAULT.check(endpoint) == endpoint


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1.evil.example/hook",  # a longer host that starts with the prefix's
        "http://localhost.evil.example/",
        "http://evil.example/127.0.0.1",
        "http://127.0.0.1@evil.example/",  # user information: the host is evil.example
        "http://localhost:80@evil.example/",
        "http://user:secret@127.0.0.1/",
        "http://127.0.0.1\\@evil.example/",
        "http://evil.example#@127.0.0.1/",
        "http://evil.example?@127.0.0.1/",
        "https://127.0.0.1/",  # another scheme
        "ftp://127.0.0.1/",
        "http://2130706433/",  # 127.0.0.1 written otherwise: another host for the list
        "http://0x7f.0.0.1/",
        "http://127.1/",
        "http://[::1]/",
        "http://127.0.0.1./",
        "http://127.0.0.1/a/../../admin",
        "http://127.0.0.1/a/%2e%2e/admin",
        "http://127.0.0.1/a/%2fadmin",
        "http://127.0.0.1 /hook",
        "http://127.0.0.1/ho ok",
        "http://127.0.0.1/hook\r\nHost: evil",
        "http://127.0.0.1/hook#fragment",
        "http://127.0.0.1:99999/",
        "http://127.0.0.1:0/",
        "http://xn--/",  # a host IDNA cannot decode
        "/hook",
        "127.0.0.1/hook",
        "http:///hook",
        "",
        "http://" + "a" * 3000,
    ],
)
def test_hostile_endpoints_are_refused(endpoint: str) -> None:
    assert not DEFAULT.allows(endpoint)
    with pytest.raises(errors.InvalidInput) as refused:
        DEFAULT.check(endpoint)
    assert refused.value.code == errors.ErrorCode.SUBSCRIPTION_ENDPOINT_NOT_ALLOWED


@pytest.mark.parametrize(
    ("endpoint", "allowed"),
    [
        ("http://localhost:8080/hooks", True),
        ("http://localhost:8080/hooks/", True),
        ("http://localhost:8080/hooks/orders", True),
        ("http://LOCALHOST:8080/hooks/orders?x=1", True),
        ("http://localhost:8080/hooksmith", False),  # not on a segment boundary
        ("http://localhost:8080/hook", False),
        ("http://localhost:8080/", False),
        ("http://localhost/hooks", False),  # the prefix names a port: that one
        ("http://localhost:8081/hooks", False),
        ("https://localhost:8080/hooks", False),
        ("http://localhost:8080/hooks/../admin", False),
        ("https://app.internal/v1/x", True),
        ("https://app.internal:443/v1/x", True),  # any port: the prefix names none
        ("https://app.internal/v1", True),
        ("https://app.internal/v2", False),
        ("http://app.internal/v1/x", False),
    ],
)
def test_prefixes_match_on_the_parsed_url(endpoint: str, allowed: bool) -> None:
    assert NARROW.allows(endpoint) is allowed


@settings(max_examples=300)
@given(
    st.text(alphabet="abc.-@:/?#%\\ 0123456789", min_size=1, max_size=20),
)
def test_nothing_after_an_allowed_host_makes_another_host_allowed(tail: str) -> None:
    """Whatever follows the allowed host's name in the URL, the URL is allowed only if httpx
    (the client that calls it) reads that very host."""
    import httpx

    endpoint = "http://127.0.0.1" + tail
    if DEFAULT.allows(endpoint):
        assert httpx.URL(endpoint).host == "127.0.0.1"


@pytest.mark.parametrize(
    "prefix",
    [
        "127.0.0.1",
        "http://",
        "http://a@b",
        "http://h/p?q=1",
        "ftp://h",
        "http://h/#x",
        "http://h:0",
    ],
)
def test_bad_prefixes_fail_at_start_up(prefix: str) -> None:
    with pytest.raises(EndpointError):
        parse_prefix(prefix)
    with pytest.raises(ValidationError, match="push_allowed_urls"):
        Settings(nats_url=["nats://127.0.0.1:4222"], push_allowed_urls=prefix)


def test_allowed_urls_are_comma_separated() -> None:
    settings = Settings(
        nats_url=["nats://127.0.0.1:4222"],
        push_allowed_urls="http://127.0.0.1:3000, https://app.internal/hooks",
    )
    assert settings.push_allowed_urls == ["http://127.0.0.1:3000", "https://app.internal/hooks"]


# -- what answers mean ---------------------------------------------------------------------

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def verdict(status: int, body: bytes = b"", **headers: str) -> outcome.Verdict:
    return outcome.classify(status, {k.replace("_", "-"): v for k, v in headers.items()}, body, NOW)


@pytest.mark.parametrize(
    ("status", "body", "kind", "label"),
    [
        (200, b"", Kind.ACK, "success"),
        (204, b"", Kind.ACK, "success"),
        (201, b"not json", Kind.ACK, "success"),
        (200, b"[1, 2]", Kind.ACK, "success"),
        (200, b'{"other": 1}', Kind.ACK, "success"),
        (200, b'{"status": "SUCCESS"}', Kind.ACK, "success"),
        (200, b'{"status": "success"}', Kind.ACK, "success"),
        (200, b'{"status": "RETRY"}', Kind.RETRY, "retry"),
        (200, b'{"status": "DROP"}', Kind.DROP, "drop"),
        (200, b'{"status": "MAYBE"}', Kind.RETRY, "retry"),
        (200, b'{"status": 3}', Kind.RETRY, "retry"),
        (200, b'{"status": null}', Kind.ACK, "success"),
        (301, b"", Kind.RETRY, "redirect"),
        (307, b"", Kind.RETRY, "redirect"),
        (408, b"", Kind.RETRY, "retry"),
        (429, b"", Kind.RETRY, "retry"),
        (500, b"", Kind.RETRY, "server_error"),
        (503, b'{"status": "SUCCESS"}', Kind.RETRY, "server_error"),  # the status decides
        (400, b"", Kind.REJECT, "rejected"),
        (404, b"", Kind.REJECT, "rejected"),
        (422, b'{"status": "RETRY"}', Kind.REJECT, "rejected"),
    ],
)
def test_answers(status: int, body: bytes, kind: Kind, label: str) -> None:
    found = verdict(status, body)
    assert (found.kind, found.label) == (kind, label)


def test_reasons() -> None:
    assert verdict(422).reason == "HTTP 422"
    assert verdict(200, b'{"status": "DROP"}').reason == "dropped by the application"
    assert "MAYBE" in verdict(200, b'{"status": "MAYBE"}').reason
    assert verdict(200, b'{"status": "MAYBE"}').noteworthy
    assert "redirect" in verdict(302, Location="http://elsewhere/").reason
    assert not verdict(200).noteworthy and not verdict(200, b'{"status":"RETRY"}').noteworthy


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("5", 5.0),
        (" 30 ", 30.0),
        ("999999999999999999999", MAX_RETRY_AFTER),
        (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
        (format_datetime(NOW - timedelta(seconds=90), usegmt=True), 0.0),  # past: at once
        (format_datetime(NOW + timedelta(days=3), usegmt=True), MAX_RETRY_AFTER),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after(value: str | None, seconds: float | None) -> None:
    assert outcome.retry_after(value, NOW) == seconds


def test_retry_after_applies_to_retries_only() -> None:
    assert verdict(503, retry_after="7").retry_after == 7.0
    assert verdict(429, retry_after="7").retry_after == 7.0
    assert verdict(200, b'{"status": "RETRY"}', retry_after="3").retry_after == 3.0
    assert verdict(200, retry_after="3").retry_after is None
    assert verdict(404, retry_after="3").retry_after is None


def test_the_delay_of_a_retry() -> None:
    # Asked for by the application: that, even 0.
    assert outcome.retry_delay(1, (10.0,), 0.0) == 0.0
    assert outcome.retry_delay(3, (10.0,), 4.0) == 4.0
    # Else the consumer's backoff for the delivery count (the last one repeats).
    backoff = (1.0, 5.0, 20.0)
    assert [outcome.retry_delay(n, backoff, None) for n in (1, 2, 3, 4, 9)] == [1, 5, 20, 20, 20]
    # Else the default schedule.
    assert [outcome.retry_delay(n, (), None) for n in (1, 2, 3, 4, 5, 6, 50)] == [
        1, 2, 5, 10, 30, 30, 30,
    ]  # fmt: skip


def test_batch_answers() -> None:
    ids = ["S:1", "S:2", "S:3", "S:4"]
    body = orjson.dumps(
        {
            "statuses": [
                {"entryId": "S:1", "status": "SUCCESS"},
                {"entryId": "S:2", "status": "RETRY"},
                {"entryId": "S:3", "status": "DROP"},
                {"entryId": "S:9", "status": "DROP"},  # not in the batch: ignored
                {"entryId": "S:1", "status": "DROP"},  # the first status of an entry counts
                "junk",
            ]
        }
    )
    kinds = [v.kind for v in outcome.classify_batch(200, {"retry-after": "2"}, body, ids, NOW)]
    assert kinds == [Kind.ACK, Kind.RETRY, Kind.DROP, Kind.RETRY]  # S:4 has none: retried
    retried = outcome.classify_batch(200, {"retry-after": "2"}, body, ids, NOW)[1]
    assert retried.retry_after == 2.0
    assert {v.kind for v in outcome.classify_batch(204, {}, b"", ids, NOW)} == {Kind.ACK}
    assert {v.kind for v in outcome.classify_batch(200, {}, b"[]", ids, NOW)} == {Kind.ACK}
    every = outcome.classify_batch(503, {}, body, ids, NOW)
    assert len(every) == 4 and {v.label for v in every} == {"server_error"}
    assert {v.kind for v in outcome.classify_batch(400, {}, b"", ids, NOW)} == {Kind.REJECT}
    drop_all = orjson.dumps({"status": "DROP"})
    assert {v.kind for v in outcome.classify_batch(200, {}, drop_all, ids, NOW)} == {Kind.DROP}


# -- the request the application gets ------------------------------------------------------

REPLY = "$JS.ACK.ORDERS.push.2.42.40.1767268800123456789.12"


def delivery(
    headers: dict[str, str] | None = None, data: bytes = b"payload", subject: str = "orders.eu.7"
) -> Delivery:
    msg = Msg(_client=None, subject=subject, reply=REPLY, data=data, headers=headers)  # type: ignore[arg-type]
    meta = acks.parse_ack_subject(REPLY)
    assert meta is not None
    return Delivery(msg, meta)


def test_the_nats_metadata_as_headers() -> None:
    request = mapping.single(delivery(), "push", cloudevents=False)
    headers = dict(request.headers)
    assert request.body == b"payload"
    assert headers == {
        "Content-Type": "application/octet-stream",
        "Nats-Subject": "orders.eu.7",
        "Nats-Stream": "ORDERS",
        "Nats-Consumer": "push",
        "Nats-Sequence": "42",
        "Nats-Delivered": "2",
        "Nats-Time": "2026-01-01T12:00:00.123456789Z",
        "Nats-Msg-Id": "ORDERS:42",
    }


def test_the_messages_own_headers() -> None:
    own = {
        "Content-Type": "application/json",
        "Nats-Msg-Id": "order-7",
        "X-Trace": "abc",
        "Host": "evil.example",
        "content-length": "1",
        "Transfer-Encoding": "chunked",
        "Connection": "close",
        "Nats-Sequence": "1",
        "nats-subject": "spoofed",
        "Nats-Pin-Id": "xyz",
        "Bad Name": "x",
        "Bad:Colon": "x",
        "X-Control": "a\x01b",
        "X-Long": "v" * 9000,
        "X-Tab": "a\tb",
        "X-Unicode": "café",
    }
    headers = mapping.single(delivery(own), "push", cloudevents=False).headers
    names = [name.lower() for name, _ in headers]
    assert len(names) == len(set(names)), names
    found = dict(headers)
    assert found["Content-Type"] == "application/json"
    assert found["Nats-Msg-Id"] == "order-7" and found["Nats-Sequence"] == "42"
    assert found["Nats-Subject"] == "orders.eu.7"
    assert found["X-Trace"] == "abc" and found["X-Tab"] == "a\tb" and found["X-Unicode"] == "café"
    for skipped in ("host", "content-length", "transfer-encoding", "connection", "nats-pin-id"):
        assert skipped not in names
    for skipped in ("Bad Name", "Bad:Colon", "X-Control", "X-Long"):
        assert skipped not in found


def test_cloudevents_binary_mode() -> None:
    found = dict(mapping.single(delivery(), "push", cloudevents=True).headers)
    assert found["ce-specversion"] == "1.0"
    assert found["ce-id"] == found["Nats-Msg-Id"] == "ORDERS:42"
    assert found["ce-source"] == "/jsgw/streams/ORDERS"
    assert found["ce-type"] == "io.nats.jetstream.message"
    assert found["ce-time"] == found["Nats-Time"]
    assert found["ce-subject"] == "orders.eu.7"
    own = {"ce-type": "com.example.order", "ce-source": "/shop", "ce-id": "x", "ce-extra": "1"}
    found = dict(mapping.single(delivery(own), "push", cloudevents=True).headers)
    assert found["ce-type"] == "com.example.order" and found["ce-source"] == "/shop"
    assert found["ce-id"] == "ORDERS:42" and found["ce-extra"] == "1"
    # Raw: the message's ce-* headers are passed as they are, none added.
    found = dict(mapping.single(delivery(own), "push", cloudevents=False).headers)
    assert found["ce-id"] == "x" and "ce-specversion" not in found


def test_a_structured_cloudevent_is_passed_as_it_is() -> None:
    event = b'{"specversion":"1.0","id":"1","source":"/s","type":"t"}'
    own = {"Content-Type": "application/cloudevents+json; charset=utf-8"}
    request = mapping.single(delivery(own, event), "push", cloudevents=True)
    found = dict(request.headers)
    assert request.body == event
    assert found["Content-Type"] == "application/cloudevents+json; charset=utf-8"
    assert not [name for name in found if name.startswith("ce-")]


def test_a_batch_is_a_json_array_of_messages() -> None:
    request = mapping.batch(
        [delivery({"A": "1"}), delivery({"Nats-Msg-Id": "m2"}, b"\x00\xff")], "push"
    )
    assert dict(request.headers) == {
        "Content-Type": "application/json",
        "Nats-Stream": "ORDERS",
        "Nats-Consumer": "push",
    }
    first, second = orjson.loads(request.body)
    assert first == {
        "id": "ORDERS:42",
        "stream": "ORDERS",
        "subject": "orders.eu.7",
        "seq": 42,
        "time": "2026-01-01T12:00:00.123456789Z",
        "headers": {"A": ["1"]},
        "data": base64.b64encode(b"payload").decode(),
        "delivered": 2,
        "consumer_seq": 40,
        "pending": 12,
    }
    assert second["id"] == "m2" and base64.b64decode(second["data"]) == b"\x00\xff"


def test_a_dead_letter() -> None:
    own = {
        "Nats-Msg-Id": "order-7",
        "Nats-Expected-Last-Sequence": "41",
        "Nats-Rollup": "sub",
        "Nats-TTL": "1s",
        "Nats-Schedule": "@every 1s",
        "Nats-Dlq-Reason": "forged",
        "X-Trace": "abc",
    }
    letter = deadletter.message("dlq.orders", delivery(own), "HTTP 422\r\nX: y")
    assert letter.subject == "dlq.orders" and letter.data == b"payload"
    assert letter.headers == {
        "X-Trace": "abc",
        "Nats-Msg-Id": "order-7",
        "Nats-Dlq-Reason": "HTTP 422  X: y",
        "Nats-Dlq-Stream": "ORDERS",
        "Nats-Dlq-Sequence": "42",
        "Nats-Dlq-Subject": "orders.eu.7",
        "Nats-Dlq-Delivered": "2",
    }


# -- the models ----------------------------------------------------------------------------

BASE = {"stream": "ORDERS", "consumer": "push", "endpoint": "http://127.0.0.1:3000/hook"}


def test_defaults_and_round_trip() -> None:
    config = Subscription.model_validate(BASE)
    assert (config.concurrency, config.batch, config.timeout_seconds) == (16, 1, 30.0)
    assert (config.format, config.ordered, config.group, config.dead_letter) == (
        "raw", False, "jsgw", None,
    )  # fmt: skip
    full = {
        **BASE,
        "concurrency": 4,
        "batch": 10,
        "timeout": "1m30s",
        "dead_letter": {"subject": "dlq.orders"},
        "consumer_config": {
            "ack_wait": "30s",
            "backoff": [1, "2s", 0.5],
            "max_deliver": 5,
            "filter_subject": "orders.>",
            "priority_timeout": "1m",
        },
    }
    made = Subscription.model_validate(full)
    out = made.out()
    assert out["timeout"] == 90
    assert out["consumer_config"]["ack_wait"] == 30
    assert out["consumer_config"]["backoff"] == [1, 2, 0.5]
    # What is stored reads back as the same subscription.
    assert Subscription.model_validate_json(orjson.dumps(out)) == made


@pytest.mark.parametrize(
    "body",
    [
        {**BASE, "format": "cloudevents", "batch": 2},
        {**BASE, "concurrency": 0},
        {**BASE, "concurrency": 1025},
        {**BASE, "batch": 1001},
        {**BASE, "timeout": 0},
        {**BASE, "timeout": "1h1s"},
        {**BASE, "concurrency": "16"},  # strict: a number is a number
        {**BASE, "ordered": "yes"},
        {**BASE, "group": "a group"},
        {**BASE, "dead_letter": {"subject": "dlq.*"}},
        {**BASE, "dead_letter": {"subject": "_INBOX.x"}},
        {**BASE, "dead_letter": {"subject": "dlq.\r\nx"}},
        {**BASE, "consumer_config": {"durable_name": "other"}},
        {**BASE, "stream": "a.b"},
        {**BASE, "consumer": "a b"},
        {**BASE, "endpoint": ""},
        {**BASE, "unknown": 1},
        {"stream": "ORDERS", "consumer": "push"},
    ],
)
def test_invalid_subscriptions(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Subscription.model_validate(body)


def test_ordered_is_one_at_a_time() -> None:
    config = Subscription.model_validate({**BASE, "ordered": True, "concurrency": 64, "batch": 9})
    assert (config.concurrency, config.batch, config.capacity) == (1, 1, 1)


def test_the_consumer_a_subscription_makes() -> None:
    plain = consumer_to_make(Subscription.model_validate(BASE))
    assert plain.ack_policy == "explicit" and plain.priority_policy is None
    ordered = consumer_to_make(
        Subscription.model_validate(
            {**BASE, "ordered": True, "group": "g1", "consumer_config": {"max_deliver": 3}}
        )
    )
    assert ordered.priority_policy == "pinned_client"
    assert ordered.priority_groups == ["g1"] and ordered.max_ack_pending == 1
    assert ordered.max_deliver == 3
    for config in (
        {"ack_policy": "all"},
        {"priority_policy": "overflow", "priority_groups": ["jsgw"]},
        {"priority_policy": "pinned_client", "priority_groups": ["other"]},
        {"max_ack_pending": 2},
    ):
        with pytest.raises(errors.InvalidInput) as refused:
            consumer_to_make(
                Subscription.model_validate({**BASE, "ordered": True, "consumer_config": config})
            )
        assert refused.value.code == errors.ErrorCode.SUBSCRIPTION_INVALID


def test_an_existing_consumer_must_fit() -> None:
    plain = Subscription.model_validate(BASE)
    ordered = Subscription.model_validate({**BASE, "ordered": True})
    pinned = {
        "ack_policy": "explicit",
        "priority_policy": "pinned_client",
        "priority_groups": ["jsgw"],
        "max_ack_pending": 1,
    }
    check_consumer(plain, {"ack_policy": "explicit"})
    check_consumer(ordered, pinned)
    check_consumer(plain, pinned)  # pulls name the group
    for config, existing in [
        (plain, {"ack_policy": "explicit", "deliver_subject": "x"}),
        (plain, {"ack_policy": "none"}),
        (plain, {**pinned, "priority_groups": ["other"]}),
        (ordered, {"ack_policy": "explicit"}),
        (ordered, {**pinned, "max_ack_pending": 1000}),
        (ordered, {**pinned, "priority_policy": "overflow"}),
    ]:
        with pytest.raises(errors.Conflict) as refused:
            check_consumer(config, existing)
        assert refused.value.code == errors.ErrorCode.SUBSCRIPTION_CONSUMER_MISMATCH


def test_the_consumers_terms() -> None:
    terms = ConsumerTerms.of(
        {"ack_wait": 2_000_000_000, "backoff": [10**9, 3 * 10**9], "max_deliver": 4}
    )
    assert (terms.ack_wait, terms.backoff, terms.max_deliver, terms.grouped) == (
        2.0, (1.0, 3.0), 4, False,
    )  # fmt: skip
    unlimited = ConsumerTerms.of({"max_deliver": -1, "priority_groups": ["g"]})
    assert (unlimited.ack_wait, unlimited.max_deliver, unlimited.grouped) == (30.0, 0, True)


# -- the subscriptions file ----------------------------------------------------------------


def write(tmp_path: Path, text: str, suffix: str = ".yaml") -> Path:
    path = tmp_path / f"subscriptions{suffix}"
    path.write_text(text)
    return path


def test_a_file_as_a_mapping_or_a_list(tmp_path: Path) -> None:
    mapping_file = write(
        tmp_path,
        """
orders:
  stream: ORDERS
  consumer: push
  endpoint: http://127.0.0.1:3000/orders
  timeout: 10s
""",
    )
    found = load(mapping_file, DEFAULT)
    assert list(found) == ["orders"] and found["orders"].timeout_seconds == 10
    as_list = write(
        tmp_path,
        orjson.dumps([{"name": "a", **BASE}, {"name": "b", **BASE}]).decode(),
        ".json",
    )
    assert list(load(as_list, DEFAULT)) == ["a", "b"]
    assert load(write(tmp_path, ""), DEFAULT) == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("orders: {stream: ORDERS, consumer: push, endpoint: http://evil.example/}", "orders"),
        ("orders: {stream: ORDERS, consumer: push}", "endpoint"),
        ("orders: {stream: ORDERS, consumer: push, endpoint: http://127.0.0.1, x: 1}", "x"),
        ("'a b': {stream: ORDERS, consumer: push, endpoint: http://127.0.0.1}", "a b"),
        ("- {stream: ORDERS, consumer: push, endpoint: http://127.0.0.1}", "no name"),
        (
            "- {name: a, stream: S, consumer: c, endpoint: http://127.0.0.1}\n"
            "- {name: a, stream: S, consumer: c, endpoint: http://127.0.0.1}",
            "twice",
        ),
        ("just text", "expected a mapping"),
        ("{unclosed", "subscriptions.yaml"),
    ],
)
def test_a_bad_file_is_refused_naming_the_problem(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SubscriptionsFileError, match=says):
        load(path, DEFAULT)
    with pytest.raises(ValidationError, match="subscriptions"):
        Settings(nats_url=["nats://127.0.0.1:4222"], subscriptions=path)


def test_the_files_endpoints_are_checked_against_the_configured_allowlist(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "orders: {stream: S, consumer: c, endpoint: 'http://app:8080/in'}")
    with pytest.raises(ValidationError, match="JSGW_PUSH_ALLOWED_URLS"):
        Settings(nats_url=["nats://127.0.0.1:4222"], subscriptions=path)
    settings = Settings(
        nats_url=["nats://127.0.0.1:4222"],
        subscriptions=path,
        push_allowed_urls="http://app:8080",
    )
    assert settings.subscriptions == path
