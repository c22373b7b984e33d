"""The per-request series are exposed exactly as prometheus_client's own collectors would;
the method label is bounded; the event-stream and write-outcome series count what happens."""

from __future__ import annotations

import re

import nats.errors
import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)

from app.auth.policy import ANONYMOUS, Principal
from app.config import Settings
from app.consumers.schemas import AckItem
from app.consumers.service import ConsumerService
from app.errors import TooManyRequests
from app.metrics import _LATENCY_BUCKETS, Metrics
from app.nats import acks
from app.sse import SseSlots

# Bucket edges, values in between and far out, including exactly on an edge ("le").
SECONDS = [0.0, 0.0001, 0.0005, 0.0007, 0.001, 0.003, 0.025, 0.4, 1.0, 9.99, 10.0, 11.0, 250.0]
HTTP = [
    ("GET", "/v1/kv/{bucket}/keys/{key}", 200),
    ("GET", "/v1/kv/{bucket}/keys/{key}", 404),
    ("PUT", "/v1/kv/{bucket}/keys/{key}", 200),
    ("POST", "/v1/publish/{subject}", 200),
]


def _reference() -> str:
    registry = CollectorRegistry(auto_describe=True)
    requests = Counter(
        "jsgw_http_requests_total",
        "HTTP requests answered, by method, route template and status.",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        "jsgw_http_request_duration_seconds",
        "Time to the end of the HTTP response, by method and route template.",
        ["method", "route"],
        buckets=_LATENCY_BUCKETS,
        registry=registry,
    )
    in_flight = Gauge(
        "jsgw_http_requests_in_flight",
        "HTTP requests (and open streams) being served.",
        registry=registry,
    )
    nats = Histogram(
        "jsgw_nats_request_duration_seconds",
        "NATS request/reply latency by gateway operation.",
        ["operation"],
        buckets=_LATENCY_BUCKETS,
        registry=registry,
    )
    for i, seconds in enumerate(SECONDS):
        method, route, status = HTTP[i % len(HTTP)]
        requests.labels(method, route, str(status)).inc()
        latency.labels(method, route).observe(seconds)
        nats.labels("kv.get" if i % 3 else "stream.info").observe(seconds)
    in_flight.inc(3)
    in_flight.dec()
    return generate_latest(registry).decode()


def _ours() -> str:
    metrics = Metrics()
    for i, seconds in enumerate(SECONDS):
        method, route, status = HTTP[i % len(HTTP)]
        metrics.observe_http(method, route, status, seconds)
        metrics.observe_nats("kv.get" if i % 3 else "stream.info", seconds)
    metrics.requests.in_flight += 3
    metrics.requests.in_flight -= 1
    return generate_latest(metrics.registry).decode()


def _series(text: str, prefixes: tuple[str, ...]) -> dict[str, str]:
    """Sample lines of the given metric names, label order normalised, creation times masked."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(prefixes):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        labels = ",".join(sorted(re.findall(r'\w+="[^"]*"', labels)))
        samples[f"{name}{{{labels}}}"] = "T" if name.endswith("_created") else value
    return samples


def test_exposition_matches_prometheus_client() -> None:
    names = (
        "jsgw_http_requests_",
        "jsgw_http_request_duration_seconds",
        "jsgw_nats_request_duration_seconds",
    )
    reference, ours = _series(_reference(), names), _series(_ours(), names)
    assert len(reference) > 60
    assert ours == reference


def test_help_and_type_lines_match() -> None:
    def meta(text: str) -> list[str]:
        wanted = ("jsgw_http_request", "jsgw_nats_request_duration")
        return sorted(
            line
            for line in text.splitlines()
            if line.startswith("#") and line.split()[2].startswith(wanted)
        )

    assert meta(_ours()) == meta(_reference())


def test_created_is_when_the_series_first_appeared() -> None:
    metrics = Metrics()
    metrics.observe_http("GET", "/x", 200, 0.01)
    metrics.observe_http("GET", "/x", 200, 0.01)
    text = generate_latest(metrics.registry).decode()
    assert 'jsgw_http_requests_total{method="GET",route="/x",status="200"} 2.0' in text
    created = re.findall(r"jsgw_http_requests_created\{[^}]*\} (\S+)", text)
    assert len(created) == 1 and float(created[0]) > 1.7e9


def test_created_series_follow_prometheus_clients_switch() -> None:
    """``disable_created_metrics()`` (or PROMETHEUS_DISABLE_CREATED_SERIES=true) drops the
    ``_created`` series of these collectors as it does for prometheus_client's own."""
    disable_created_metrics()
    try:
        names = (
            "jsgw_http_requests_",
            "jsgw_http_request_duration_seconds",
            "jsgw_nats_request_duration_seconds",
        )
        ours, reference = _series(_ours(), names), _series(_reference(), names)
        assert not any("_created" in name for name in ours)
        assert ours == reference
    finally:
        enable_created_metrics()
    assert any("_created" in name for name in _series(_ours(), ("jsgw_http_requests_",)))


def test_unknown_methods_share_one_series() -> None:
    """The method comes from the client: any method outside the standard ones is "other", so
    a client sending made-up methods cannot make a series of each."""
    metrics = Metrics()
    for method in ("GET", "PATCH", "OPTIONS", "BREW", "PROPFIND", "get", "X" * 200):
        metrics.observe_http(method, "unmatched", 405, 0.001)
    text = generate_latest(metrics.registry).decode()
    methods = set(re.findall(r'jsgw_http_requests_total\{method="([^"]*)"', text))
    assert methods == {"GET", "PATCH", "OPTIONS", "other"}
    assert 'jsgw_http_requests_total{method="other",route="unmatched",status="405"} 4.0' in text
    latency = set(re.findall(r'jsgw_http_request_duration_seconds_count\{method="([^"]*)"', text))
    assert latency == methods


async def test_event_stream_slots_are_exported() -> None:
    """Open streams by kind, the worker's cap, and refusals by the cap that refused."""
    metrics = Metrics()
    slots = SseSlots(2, 3, 1, per_address=1, metrics=metrics)

    def sample(name: str, labels: str = "") -> float:
        text = generate_latest(metrics.registry).decode()
        match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
        assert match, name + labels
        return float(match.group(1))

    def refused(reason: str) -> float:
        return sample("jsgw_sse_streams_refused_total", f'{{reason="{reason}"}}')

    assert sample("jsgw_sse_streams_limit") == 3
    assert sample("jsgw_sse_streams_open", '{kind="kv_watch"}') == 0
    one = {"type": "http", "client": ("192.0.2.1", 1)}
    watch = slots.acquire(ANONYMOUS, one, "kv_watch")
    with pytest.raises(TooManyRequests):
        slots.acquire(ANONYMOUS, one, "consume")
    alice = Principal("alice")
    consume = [slots.acquire(alice, one, "consume") for _ in range(2)]
    for principal in (alice, ANONYMOUS):
        with pytest.raises(TooManyRequests, match="this gateway"):
            slots.acquire(principal, one, "consume")
    assert sample("jsgw_sse_streams_open", '{kind="kv_watch"}') == 1
    assert sample("jsgw_sse_streams_open", '{kind="consume"}') == 2
    assert (refused("address"), refused("streams"), refused("token")) == (1, 2, 0)
    await consume[0]()
    await watch()
    await watch()  # (idempotent)
    assert sample("jsgw_sse_streams_open", '{kind="kv_watch"}') == 0
    assert sample("jsgw_sse_streams_open", '{kind="consume"}') == 1
    slots.acquire(alice, one, "consume")
    with pytest.raises(TooManyRequests, match="this token"):
        slots.acquire(alice, one, "consume")
    assert refused("token") == 1
    assert refused("streams") == 2


async def test_acks_of_unknown_outcome_are_counted() -> None:
    """An ack the server did not confirm in time is answered nats.outcome_unknown and counted;
    a confirmed one is not."""

    class Pool:
        async def requests(self, requests: list[tuple[str, bytes]], **_: object) -> list[object]:
            return [None, nats.errors.TimeoutError()]

    secret = b"k" * 32
    metrics = Metrics()
    service = ConsumerService(Pool(), None, Settings(), secret, metrics)  # type: ignore[arg-type]
    items = [
        AckItem(token=acks.sign(secret, "S", "C", f"$JS.ACK.S.C.1.{seq}.{seq}.1700000000.0"))
        for seq in (1, 2)
    ]
    results = await service.ack("S", "C", items)
    codes = [r.get("error", {}).get("code") for r in results]
    assert codes == [None, "nats.outcome_unknown"]
    text = generate_latest(metrics.registry).decode()
    assert 'jsgw_publish_outcome_unknown_total{operation="ack"} 1.0' in text
    assert 'jsgw_publish_outcome_unknown_total{operation="publish"} 0.0' in text
