"""Prometheus collectors. One registry per app, so tests and workers never share state.

The series every request touches (HTTP requests and latency, requests in flight, NATS request
latency) are plain numbers kept by :class:`RequestSeries` and turned into metric families when
scraped: prometheus_client's own counters and histograms take a lock for every increment, and
every request made several of them. A worker observes and scrapes them on its one event-loop
thread, so no lock is needed; the exposition is the one prometheus_client writes for its own.
What changes less often than requests (an event stream opened or closed, a write of unknown
outcome, a NATS error) uses prometheus_client's collectors.

With several workers (``JSGW_WORKERS``), ``jsgw serve`` gives them a directory of their own in
``PROMETHEUS_MULTIPROC_DIR`` (set before any worker imports prometheus_client) and the workers
run in prometheus_client's multiprocess mode: every value is also written to a memory-mapped
file per worker, and ``/metrics``, whichever worker answers, reads the files of all of them
(see :class:`SharedFiles` and :meth:`Metrics.exposition`). Without the variable (one worker,
tests) nothing is written to files and the exposition is the process's own registry.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
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
_BOUNDS = (*map(floatToGoString, _LATENCY_BUCKETS), "+Inf")
# An application's answers to push deliveries take from milliseconds to a POST's timeout.
PUSH_LATENCY_BUCKETS = (
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
    30.0,
    60.0,
)
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

_REQUESTS = ("jsgw_http_requests", "HTTP requests answered, by method, route template and status.")
_HTTP_LATENCY = (
    "jsgw_http_request_duration_seconds",
    "Time to the end of the HTTP response, by method and route template.",
)
_IN_FLIGHT = ("jsgw_http_requests_in_flight", "HTTP requests (and open streams) being served.")
_NATS_LATENCY = (
    "jsgw_nats_request_duration_seconds",
    "NATS request/reply latency by gateway operation.",
)
# The ``method`` label takes these as they are and "other" for anything else: a client that
# sends made-up methods must not make a series of each.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# The fixed label values of the event-stream and write-outcome series (also set to 0 at start,
# so that rates and increases have a series to start from).
SSE_KINDS = ("kv_watch", "consume", "core_subscribe")
SSE_REFUSALS = ("streams", "token", "address", "kv_watches")
WATCH_DROPS = ("behind", "stuck")
UNKNOWN_OUTCOMES = ("publish", "publish_atomic", "kv_write", "ack", "counter", "push_dead_letter")


class _ValueFile(Protocol):
    """What is used of prometheus_client's ``MmapedDict`` (untyped): a file of named floats."""

    def read_value(self, key: str) -> tuple[float, float]: ...

    def write_value(self, key: str, value: float, timestamp: float) -> None: ...


def _value_file(path: str) -> _ValueFile:
    return cast(_ValueFile, MmapedDict(path))  # type: ignore[no-untyped-call]


def multiprocess_dir() -> str | None:
    """The directory the workers share their values in, when ``jsgw serve`` runs several."""
    return os.environ.get(MULTIPROC_DIR) or None


class SharedFiles:
    """This worker's files for the lock-free series, in prometheus_client's multiprocess
    format (what its ``MultiProcessCollector`` reads). Their names differ from the ones its own
    values use (``counter_<pid>.db``, ...): two writers of one file would overwrite each other.
    A value is written where it is kept, one ``struct.pack_into`` in a shared mapping; a new
    series starts from what its file holds (a worker that reuses a dead one's pid continues its
    counts instead of overwriting them)."""

    def __init__(self, path: str) -> None:
        pid = os.getpid()
        self.counters = _value_file(os.path.join(path, f"counter_requests-{pid}.db"))
        self.histograms = _value_file(os.path.join(path, f"histogram_requests-{pid}.db"))
        # gauge_<mode>_<pid>_<name>.db: the collector reads the mode from the second part.
        self.gauges = _value_file(os.path.join(path, f"gauge_livesum_{pid}_requests.db"))
        self.in_flight_key = mmap_key(_IN_FLIGHT[0], _IN_FLIGHT[0], [], [], _IN_FLIGHT[1])
        self.gauges.write_value(self.in_flight_key, 0.0, 0.0)

    def in_flight(self, value: int) -> None:
        self.gauges.write_value(self.in_flight_key, value, 0.0)

    def counter(self, labels: dict[str, str]) -> tuple[str, float]:
        key = mmap_key(
            _REQUESTS[0], _REQUESTS[0] + "_total", list(labels), list(labels.values()), _REQUESTS[1]
        )
        return key, self.counters.read_value(key)[0]

    def histogram(self, family: tuple[str, str], labels: dict[str, str]) -> _Latencies:
        name, documentation = family
        names, values = list(labels), list(labels.values())
        keys = [
            mmap_key(name, name + "_bucket", [*names, "le"], [*values, bound], documentation)
            for bound in _BOUNDS
        ]
        keys.append(mmap_key(name, name + "_sum", names, values, documentation))
        return _SharedLatencies(self.histograms, keys)


def prune_dead_workers(path: str) -> None:
    """Remove the live gauges of workers that are gone (killed ones included: uvicorn's
    supervisor, which replaces them, calls nothing of prometheus_client's). Their counters and
    histograms stay: what a worker counted before it died has happened."""
    seen: set[int] = set()
    for file in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        parts = os.path.basename(file)[: -len(".db")].split("_")
        try:
            pid = int(parts[2])
        except (IndexError, ValueError):
            continue
        if pid in seen or _alive(pid):
            continue
        seen.add(pid)
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
        for own in glob.glob(os.path.join(path, f"gauge_live*_{pid}_*.db")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(own)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


class _SharedLatencies(_Latencies):
    """A histogram series also written to the worker's file: the keys of its buckets, then of
    its sum (a class of its own, so that one worker pays no test per observation)."""

    __slots__ = ("file", "keys")

    def __init__(self, file: _ValueFile, keys: list[str]) -> None:
        super().__init__()
        self.file = file
        self.keys = keys
        self.counts = [int(file.read_value(key)[0]) for key in keys[:-1]]
        self.total = file.read_value(keys[-1])[0]

    def observe(self, seconds: float) -> None:
        bucket = bisect_left(_LATENCY_BUCKETS, seconds)
        counts = self.counts
        counts[bucket] += 1
        self.total += seconds
        self.file.write_value(self.keys[bucket], counts[bucket], 0.0)
        self.file.write_value(self.keys[-1], self.total, 0.0)


class RequestSeries(Collector):
    """The per-request series, without locks (see the module's docstring)."""

    def __init__(self, shared: SharedFiles | None = None) -> None:
        self.in_flight = 0
        self.shared = shared
        # (method, route, status) -> [count, created, key in the shared file ("" without)]
        self.http_counts: dict[tuple[str, str, int], list[Any]] = {}
        self.http_latency: dict[tuple[str, str], _Latencies] = {}
        self.nats_latency: dict[str, _Latencies] = {}

    def collect(self) -> Iterator[Metric]:
        created = _use_created()
        requests = Metric(*_REQUESTS, "counter")
        for (method, route, status), (count, since, _) in self.http_counts.items():
            labels = {"method": method, "route": route, "status": str(status)}
            requests.add_sample("jsgw_http_requests_total", labels, count)
            if created:
                requests.add_sample("jsgw_http_requests_created", labels, since)
        yield requests
        yield _histogram(
            *_HTTP_LATENCY,
            [({"method": m, "route": r}, series) for (m, r), series in self.http_latency.items()],
            created,
        )
        in_flight = Metric(*_IN_FLIGHT, "gauge")
        in_flight.add_sample("jsgw_http_requests_in_flight", {}, self.in_flight)
        yield in_flight
        yield _histogram(
            *_NATS_LATENCY,
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
    for labels, latencies in series:
        cumulative = 0
        for bound, count in zip(_BOUNDS, latencies.counts, strict=True):
            cumulative += count
            metric.add_sample(name + "_bucket", {**labels, "le": bound}, cumulative)
        metric.add_sample(name + "_count", labels, cumulative)
        metric.add_sample(name + "_sum", labels, latencies.total)
        if created:
            metric.add_sample(name + "_created", labels, latencies.created)
    return metric


class Metrics:
    """The collectors. The per-request series are in :attr:`requests`; observe them through
    :meth:`observe_http`, :meth:`observe_nats` and :attr:`requests.in_flight` (with several
    workers, also written through ``requests.shared.in_flight``, as the middleware does)."""

    def __init__(self) -> None:
        # The process's own collectors; with several workers, /metrics reads every worker's
        # files instead (:meth:`exposition`).
        self.registry = CollectorRegistry(auto_describe=True)
        self.shared_dir = multiprocess_dir()
        self._sampled: list[tuple[Gauge, Callable[[], float]]] = []
        self._all_workers: CollectorRegistry | None = None
        shared = None
        if self.shared_dir is not None:
            shared = SharedFiles(self.shared_dir)
            self._all_workers = CollectorRegistry()
            MultiProcessCollector(self._all_workers, self.shared_dir)  # type: ignore[no-untyped-call]
        self.requests = RequestSeries(shared)
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
            multiprocess_mode="livesum",
        )
        self.pool_size = Gauge(
            "jsgw_nats_pool_size",
            "Configured number of pooled NATS connections.",
            registry=self.registry,
            multiprocess_mode="livesum",
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
        self.sse_streams_open = Gauge(
            "jsgw_sse_streams_open",
            "Open SSE streams (KV watches, consume streams, core NATS subscriptions), by kind.",
            ["kind"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.sse_streams_limit = Gauge(
            "jsgw_sse_streams_limit",
            "The cap on open SSE streams (JSGW_SSE_MAX_STREAMS, per worker).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.sse_streams_refused = Counter(
            "jsgw_sse_streams_refused",
            "SSE streams refused with 429 at a cap: 'streams' (the worker's), 'token', "
            "'address' (an anonymous client's), 'kv_watches' (JSGW_KV_MAX_WATCHES).",
            ["reason"],
            registry=self.registry,
        )
        self.kv_watches_open = Gauge(
            "jsgw_kv_watches_open",
            "Open KV watches.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.kv_watches_limit = Gauge(
            "jsgw_kv_watches_limit",
            "The cap on open KV watches (JSGW_KV_MAX_WATCHES, per worker).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.kv_watches_dropped = Counter(
            "jsgw_kv_watches_dropped",
            "KV watches cut off because their client was too slow: 'behind' (its queue of "
            "JSGW_SSE_QUEUE_SIZE events was full), 'stuck' (a send waited too long).",
            ["reason"],
            registry=self.registry,
        )
        self.outcome_unknown = Counter(
            "jsgw_publish_outcome_unknown",
            "Writes answered nats.outcome_unknown (not confirmed in time: they may or may not "
            "have been applied), by operation: 'publish', 'publish_atomic', 'kv_write', 'ack', "
            "'counter', 'push_dead_letter'.",
            ["operation"],
            registry=self.registry,
        )
        for reason in SSE_REFUSALS:
            self.sse_streams_refused.labels(reason)
        for reason in WATCH_DROPS:
            self.kv_watches_dropped.labels(reason)
        for operation in UNKNOWN_OUTCOMES:
            self.outcome_unknown.labels(operation)
        self.kv_stale_reads = Counter(
            "jsgw_kv_stale_reads_total",
            "Reads of a KV key's latest value that Direct Get answered older than a revision "
            "this process had served or written for the key (a replica catching up), and "
            "history, revision and multi-key reads that a mirror answered: read again from "
            "the bucket's own stream.",
            registry=self.registry,
        )

        # Core NATS subscribe streams (app.corenats): one route, so no labels.
        self.core_messages_sent = Counter(
            "jsgw_core_subscribe_messages",
            "Messages sent to clients on core NATS subscribe streams "
            "(GET /v1/nats/subscribe/{subject}).",
            registry=self.registry,
        )
        self.core_slow_consumers = Counter(
            "jsgw_core_subscribe_slow_consumers",
            "Core NATS subscribe streams ended with nats.slow_consumer: their client fell "
            "JSGW_SSE_QUEUE_SIZE messages or JSGW_NATS_SUBSCRIBE_QUEUE_BYTES behind.",
            registry=self.registry,
        )

        # Push delivery (app.push), by subscription: operator-declared names, so bounded.
        self.push_delivered = Counter(
            "jsgw_push_delivered_total",
            "Messages POSTed to the application (a message delivered again counts again).",
            ["subscription"],
            registry=self.registry,
        )
        self.push_acked = Counter(
            "jsgw_push_acked_total",
            "Messages the application took (2xx, SUCCESS) whose ack the server confirmed.",
            ["subscription"],
            registry=self.registry,
        )
        self.push_retried = Counter(
            "jsgw_push_retried_total",
            "Messages given back for a later delivery (nak): RETRY, 408, 429, 5xx, 3xx, no "
            "answer in time, no connection.",
            ["subscription"],
            registry=self.registry,
        )
        self.push_terminated = Counter(
            "jsgw_push_terminated_total",
            "Messages ended undelivered: dropped or refused (4xx) by the application, "
            "dead-lettered, or failed on their last delivery (max_deliver).",
            ["subscription"],
            registry=self.registry,
        )
        self.push_dead_lettered = Counter(
            "jsgw_push_dead_lettered_total",
            "Messages published to the subscription's dead-letter subject.",
            ["subscription"],
            registry=self.registry,
        )
        self.push_in_flight = Gauge(
            "jsgw_push_in_flight",
            "Messages a gateway process holds for a subscription: POSTed, or waiting for a "
            "free POST (at most concurrency x batch per process).",
            ["subscription"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.push_latency = Histogram(
            "jsgw_push_app_latency_seconds",
            "Time from a POST to the application's whole answer, by subscription and outcome "
            "(success, retry, drop, rejected, redirect, server_error, timeout, unreachable).",
            ["subscription", "outcome"],
            buckets=PUSH_LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.obj_bytes = Counter(
            "jsgw_obj_bytes_total",
            "Object content bytes moved through the gateway, by direction (in: uploads, out: "
            "downloads) and route template.",
            ["direction", "route"],
            registry=self.registry,
        )

        self.access_log_dropped = Counter(
            "jsgw_access_log_dropped_total",
            "Access log lines dropped because stderr took them slower than requests came: "
            "more than 4 MiB of lines were waiting to be written.",
            registry=self.registry,
        )

    def gauge_function(self, gauge: Gauge, function: Callable[[], float]) -> None:
        """A gauge whose value is computed: at scrape time with one worker; with several (no
        worker can call another's function) whenever :meth:`refresh` is called, which the
        owner of the value does on every change, and the answering worker before a scrape."""
        if self.shared_dir is None:
            gauge.set_function(function)
        else:
            self._sampled.append((gauge, function))
            gauge.set(function())

    def refresh(self) -> None:
        for gauge, function in self._sampled:
            gauge.set(function())

    def exposition(self) -> bytes:
        """The text /metrics answers: this process's registry, or every worker's files."""
        if self._all_workers is None or self.shared_dir is None:
            return generate_latest(self.registry)
        self.refresh()
        prune_dead_workers(self.shared_dir)
        return generate_latest(self._all_workers)

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        if method not in _METHODS:
            method = "other"
        series = self.requests
        count = series.http_counts.get((method, route, status))
        if count is None:
            count = series.http_counts[(method, route, status)] = self._new_count(
                method, route, status
            )
        count[0] += 1
        if count[2]:
            series.shared.counters.write_value(count[2], count[0], 0.0)  # type: ignore[union-attr]
        latencies = series.http_latency.get((method, route))
        if latencies is None:
            latencies = series.http_latency[(method, route)] = self._new_latencies(
                _HTTP_LATENCY, {"method": method, "route": route}
            )
        latencies.observe(seconds)

    def observe_nats(self, operation: str, seconds: float) -> None:
        latencies = self.requests.nats_latency.get(operation)
        if latencies is None:
            latencies = self.requests.nats_latency[operation] = self._new_latencies(
                _NATS_LATENCY, {"operation": operation}
            )
        latencies.observe(seconds)

    def _new_count(self, method: str, route: str, status: int) -> list[Any]:
        shared = self.requests.shared
        if shared is None:
            return [0, time.time(), ""]
        key, count = shared.counter({"method": method, "route": route, "status": str(status)})
        return [count, time.time(), key]

    def _new_latencies(self, family: tuple[str, str], labels: dict[str, str]) -> _Latencies:
        shared = self.requests.shared
        return _Latencies() if shared is None else shared.histogram(family, labels)
