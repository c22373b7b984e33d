"""Prometheus collectors. One registry per app, so tests and workers never share state."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Metrics:
    """The collectors, plus caches of their labelled children: ``labels()`` validates and
    looks up its arguments on every call, a cost that shows in the hot path."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "jsgw_http_requests_total",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "jsgw_http_request_duration_seconds",
            "Time to the end of the HTTP response, by method and route template.",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.http_in_flight = Gauge(
            "jsgw_http_requests_in_flight",
            "HTTP requests (and open streams) being served.",
            registry=self.registry,
        )
        self.nats_latency = Histogram(
            "jsgw_nats_request_duration_seconds",
            "NATS request/reply latency by gateway operation.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
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
        self.nats_replaced = Counter(
            "jsgw_nats_connections_replaced_total",
            "Pooled connections that the client gave up on and the pool replaced.",
            registry=self.registry,
        )

        self._http: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._nats: dict[str, Any] = {}

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        children = self._http.get((method, route, status))
        if children is None:
            children = self._http[(method, route, status)] = (
                self.http_requests.labels(method, route, str(status)),
                self.http_latency.labels(method, route),
            )
        children[0].inc()
        children[1].observe(seconds)

    def observe_nats(self, operation: str, seconds: float) -> None:
        child = self._nats.get(operation)
        if child is None:
            child = self._nats[operation] = self.nats_latency.labels(operation)
        child.observe(seconds)
