"""Prometheus collectors. One registry per app, so tests and workers never share state.

The series every request touches (HTTP requests and latency, requests in flight, NATS request
latency) are plain numbers kept by :class:`RequestSeries` and turned into metric families when
scraped: prometheus_client's own counters and histograms take a lock for every increment, and
every request made several of them. A worker observes and scrapes them on its one event-loop
thread, so no lock is needed; the exposition is the one prometheus_client writes for its own.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class _Latencies:
    """One histogram series: counts per bucket (not cumulative), sum, creation time."""

    __slots__ = ("counts", "created", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0
        self.created = time.time()

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1  # buckets are "le"
        self.total += seconds


class RequestSeries(Collector):
    """The per-request series, without locks (see the module's docstring)."""

    def __init__(self) -> None:
        self.in_flight = 0
        # (method, route, status) -> [count, created]
        self.http_counts: dict[tuple[str, str, int], list[float]] = {}
        self.http_latency: dict[tuple[str, str], _Latencies] = {}
        self.nats_latency: dict[str, _Latencies] = {}

    def collect(self) -> Iterator[Metric]:
        created = _use_created()
        requests = Metric(
            "jsgw_http_requests",
            "HTTP requests answered, by method, route template and status.",
            "counter",
        )
        for (method, route, status), (count, since) in self.http_counts.items():
            labels = {"method": method, "route": route, "status": str(status)}
            requests.add_sample("jsgw_http_requests_total", labels, count)
            if created:
                requests.add_sample("jsgw_http_requests_created", labels, since)
        yield requests
        yield _histogram(
            "jsgw_http_request_duration_seconds",
            "Time to the end of the HTTP response, by method and route template.",
            [({"method": m, "route": r}, series) for (m, r), series in self.http_latency.items()],
            created,
        )
        in_flight = Metric(
            "jsgw_http_requests_in_flight",
            "HTTP requests (and open streams) being served.",
            "gauge",
        )
        in_flight.add_sample("jsgw_http_requests_in_flight", {}, self.in_flight)
        yield in_flight
        yield _histogram(
            "jsgw_nats_request_duration_seconds",
            "NATS request/reply latency by gateway operation.",
            [({"operation": op}, series) for op, series in self.nats_latency.items()],
            created,
        )


def _use_created() -> bool:
    """Whether prometheus_client writes ``_created`` series (PROMETHEUS_DISABLE_CREATED_SERIES,
    ``disable_created_metrics()``): these series follow the same setting."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


def _histogram(
    name: str,
    documentation: str,
    series: list[tuple[dict[str, str], _Latencies]],
    created: bool,
) -> Metric:
    metric = Metric(name, documentation, "histogram")
    bounds = [*map(floatToGoString, _LATENCY_BUCKETS), "+Inf"]
    for labels, latencies in series:
        cumulative = 0
        for bound, count in zip(bounds, latencies.counts, strict=True):
            cumulative += count
            metric.add_sample(name + "_bucket", {**labels, "le": bound}, cumulative)
        metric.add_sample(name + "_count", labels, cumulative)
        metric.add_sample(name + "_sum", labels, latencies.total)
        if created:
            metric.add_sample(name + "_created", labels, latencies.created)
    return metric


class Metrics:
    """The collectors. The per-request series are in :attr:`requests`; observe them through
    :meth:`observe_http`, :meth:`observe_nats` and :attr:`requests.in_flight`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestSeries()
        self.registry.register(self.requests)
        self.nats_errors = Counter(
            "jsgw_nats_request_errors_total",
            "NATS requests that failed, by operation and kind (timeout, no_responders, ...).",
            ["operation", "kind"],
            registry=self.registry,
        )
        self.pool_connections_up = Gauge(
            "jsgw_nats_pool_connections_up",
            "Pooled NATS connections currently connected.",
            registry=self.registry,
        )
        self.pool_size = Gauge(
            "jsgw_nats_pool_size",
            "Configured number of pooled NATS connections.",
            registry=self.registry,
        )
        self.nats_reconnects = Counter(
            "jsgw_nats_reconnects_total",
            "Reconnections of pooled NATS connections.",
            registry=self.registry,
        )
        self.nats_extra_replies = Counter(
            "jsgw_nats_extra_replies_total",
            "Replies no request waited for: 'second' answers to a write already answered (two "
            "servers answering for one stream, as after a partition), 'late' ones after a "
            "request's timeout.",
            ["kind"],
            registry=self.registry,
        )
        self.nats_probes_failed = Counter(
            "jsgw_nats_probes_failed_total",
            "Pooled connections found dead by a ping after their requests timed out "
            "(then reconnected).",
            registry=self.registry,
        )
        self.nats_replaced = Counter(
            "jsgw_nats_connections_replaced_total",
            "Pooled connections that the client gave up on and the pool replaced.",
            registry=self.registry,
        )
        self.kv_stale_reads = Counter(
            "jsgw_kv_stale_reads_total",
            "Reads of a KV key's latest value that Direct Get answered older than a revision "
            "this process had served or written for the key (a replica catching up), read "
            "again from the stream leader.",
            registry=self.registry,
        )

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        series = self.requests
        count = series.http_counts.get((method, route, status))
        if count is None:
            count = series.http_counts[(method, route, status)] = [0, time.time()]
        count[0] += 1
        latencies = series.http_latency.get((method, route))
        if latencies is None:
            latencies = series.http_latency[(method, route)] = _Latencies()
        latencies.observe(seconds)

    def observe_nats(self, operation: str, seconds: float) -> None:
        latencies = self.requests.nats_latency.get(operation)
        if latencies is None:
            latencies = self.requests.nats_latency[operation] = _Latencies()
        latencies.observe(seconds)
