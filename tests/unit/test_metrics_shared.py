"""The per-request series in the files several workers share (PROMETHEUS_MULTIPROC_DIR):
read back through prometheus_client's MultiProcessCollector, they are what one process
exposes; a worker that takes a dead one's pid continues its counts; the live gauges of gone
workers are dropped, their counters kept. (The two-worker gateway itself:
tests/integration/test_metrics_workers.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from app.metrics import MULTIPROC_DIR, Metrics, prune_dead_workers
from tests.unit.test_metrics import HTTP, SECONDS, _series

NAMES = ("jsgw_http_requests_total", "jsgw_http_request_duration_seconds_", "jsgw_nats_request")


def _observe(metrics: Metrics) -> None:
    for i, seconds in enumerate(SECONDS):
        method, route, status = HTTP[i % len(HTTP)]
        metrics.observe_http(method, route, status, seconds)
        metrics.observe_nats("kv.get" if i % 3 else "stream.info", seconds)


def _without_created(samples: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in samples.items() if "_created{" not in k}


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(MULTIPROC_DIR, str(tmp_path))
    return tmp_path


def test_files_read_back_as_one_process_exposes_them(shared: Path) -> None:
    metrics = Metrics()
    assert metrics.shared_dir == str(shared)
    _observe(metrics)
    alone = _without_created(_series(generate_latest(metrics.registry).decode(), NAMES))
    assert len(alone) > 60
    assert _series(metrics.exposition().decode(), NAMES) == alone


def test_in_flight_is_written_as_it_changes(shared: Path) -> None:
    metrics = Metrics()
    requests = metrics.requests
    assert requests.shared is not None
    requests.in_flight += 3
    requests.shared.in_flight(requests.in_flight)
    assert "jsgw_http_requests_in_flight 3.0" in metrics.exposition().decode()


def test_a_reused_pid_continues_the_counts(shared: Path) -> None:
    first = Metrics()
    first.observe_http("GET", "/x", 200, 0.01)
    first.observe_http("GET", "/x", 200, 0.01)
    second = Metrics()  # the same pid, as a new worker that got a dead one's
    second.observe_http("GET", "/x", 200, 2.0)
    text = second.exposition().decode()
    assert 'jsgw_http_requests_total{method="GET",route="/x",status="200"} 3.0' in text
    assert 'jsgw_http_request_duration_seconds_count{method="GET",route="/x"} 3.0' in text
    assert 'jsgw_http_request_duration_seconds_bucket{le="0.01",method="GET",route="/x"} 2.0' in (
        text
    )


def test_computed_gauges_are_refreshed_before_a_scrape(shared: Path) -> None:
    # In a process of its own: prometheus_client chooses file-backed values at its import.
    script = (
        "from app.metrics import Metrics\n"
        "m = Metrics()\n"
        "up = [1]\n"
        "m.gauge_function(m.pool_connections_up, lambda: up[0])\n"
        "m.pool_size.set(2)\n"
        "up[0] = 2\n"
        "print(m.exposition().decode())\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, MULTIPROC_DIR: str(shared), "PYTHONPATH": root}
    text = subprocess.run(
        [sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert "jsgw_nats_pool_connections_up 2.0" in text
    assert "jsgw_nats_pool_size 2.0" in text


def test_gone_workers_lose_their_live_gauges_not_their_counts(shared: Path) -> None:
    metrics = Metrics()
    metrics.observe_http("GET", "/x", 200, 0.01)
    dead = _dead_pid()
    for file in shared.glob(f"*{os.getpid()}*.db"):
        shutil.copy(file, shared / file.name.replace(str(os.getpid()), str(dead)))
    prune_dead_workers(str(shared))
    names = {f.name for f in shared.glob("*.db")}
    assert not any(n.startswith("gauge_") and str(dead) in n for n in names), names
    assert f"counter_requests-{dead}.db" in names
    assert f"gauge_livesum_{os.getpid()}_requests.db" in names
    text = metrics.exposition().decode()
    assert 'jsgw_http_requests_total{method="GET",route="/x",status="200"} 2.0' in text
    assert "jsgw_http_requests_in_flight 0.0" in text


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
