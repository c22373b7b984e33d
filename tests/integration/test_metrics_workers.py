"""One metrics view per gateway with several workers (JSGW_WORKERS=2).

Against a real `jsgw serve` process with two uvicorn workers, on the session's nats-server,
every request and scrape over a new connection (so the kernel spreads them over the workers):

- ``jsgw_http_requests_total`` never goes back between scrapes and reaches exactly the number
  of requests sent; gauges are summed over the live workers;
- a worker killed (SIGKILL) and replaced by uvicorn leaves its counts in, counted once, and
  its live gauges out;
- SSE streams open on either worker are summed, and so are the workers' caps;
- the shared directory is the gateway's: created empty in its TMPDIR, removed at exit.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from app.nats.embedded import EmbeddedServer
from tests.helpers import jsgw_serve

ROUTE = "/v1/info"
REQUESTS = 300
POOL_SIZE = 2


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    tmp: Path  # the gateway's TMPDIR: its metrics directory is made there
    log: Path
    # Keeps no connection: each request opens its own (see _get).
    http: httpx.Client

    def metrics_dir(self) -> Path:
        (folder,) = self.tmp.glob("jsgw-metrics-*")
        return folder

    def worker_pids(self) -> set[int]:
        """The workers that wrote a request series (their live gauge files)."""
        return {
            int(f.name.split("_")[2])
            for f in self.metrics_dir().glob("gauge_livesum_*_requests.db")
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def gateway(nats_server: EmbeddedServer, tmp_path: Path) -> Iterator[Gateway]:
    port = _free_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    settings = {
        "JSGW_NATS_URL": nats_server.url,
        "JSGW_PORT": str(port),
        "JSGW_WORKERS": "2",
        "JSGW_POOL_SIZE": str(POOL_SIZE),
        "JSGW_ACK_SECRET": "metrics-test-secret-0123456789abcdef",
        "JSGW_DATA_DIR": str(tmp_path / "data"),
        "JSGW_LOG_LEVEL": "info",
        "JSGW_ACCESS_LOG": "false",
    }
    environ = {
        "TMPDIR": str(tmp),
        # Inherited values are not used: the gateway makes its own directory.
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    log = tmp_path / "gateway.log"
    with (
        jsgw_serve(settings, log, ready=None, environ=environ) as proc,
        httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as http,
    ):
        gateway = Gateway(proc, f"http://127.0.0.1:{port}", tmp, log, http)
        _wait_for_workers(gateway, 2)
        yield gateway
    assert proc.returncode == 0, log.read_text()
    assert not list(tmp.glob("jsgw-metrics-*")), "the metrics directory outlived the gateway"
    assert not list(tmp_path.glob("*.db")), "an inherited PROMETHEUS_MULTIPROC_DIR was used"


# What a worker sets as its lifespan starts, with its value: the view sums them.
STARTED_GAUGES = {
    "jsgw_nats_pool_size": POOL_SIZE,
    "jsgw_nats_pool_connections_up": POOL_SIZE,
    "jsgw_sse_streams_limit": 5000,
    "jsgw_kv_watches_limit": 10_000,
}


def _wait_for_workers(gateway: Gateway, count: int, exclude: frozenset[int] = frozenset()) -> None:
    """Until ``count`` workers (none of ``exclude``) have started and the gateway is ready.

    A worker's files are made before its lifespan runs, and /readyz may be answered by
    another: started means its start-up gauges are in the view too (``count`` workers' worth,
    or more: a dead worker's left in, which the tests then catch)."""
    deadline = time.monotonic() + 60
    while True:
        assert gateway.proc.poll() is None, gateway.log.read_text()
        assert time.monotonic() < deadline, gateway.log.read_text()
        try:
            live = [pid for pid in gateway.worker_pids() if pid not in exclude and _alive(pid)]
            if (
                len(live) >= count
                and _get(gateway, "/readyz").status_code == 200
                and _started(_scrape(gateway), count)
            ):
                return
        except (ValueError, httpx.HTTPError):  # (no directory yet; not listening yet)
            pass
        time.sleep(0.2)


def _started(text: str, count: int) -> bool:
    for name, value in STARTED_GAUGES.items():
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        if match is None or float(match.group(1)) < count * value:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _get(gateway: Gateway, path: str) -> httpx.Response:
    # A new connection every time: the client keeps none, and the gateway closes it. (One
    # client for all: a new one per request costs more than the request, its TLS context.)
    return gateway.http.get(gateway.url + path, headers={"Connection": "close"})


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name}{labels} in:\n{text}"
    return float(match.group(1))


def _scrape(gateway: Gateway) -> str:
    answer = _get(gateway, "/metrics")
    assert answer.status_code == 200
    return answer.text


def _requests(text: str) -> float:
    labels = f'{{method="GET",route="{ROUTE}",status="200"}}'
    if f"jsgw_http_requests_total{labels}" not in text:
        return 0.0
    return _sample(text, "jsgw_http_requests_total", labels)


def _send(gateway: Gateway, count: int, seen: list[float]) -> None:
    """``count`` requests, a scrape after every tenth; every count read goes to ``seen``."""
    for i in range(count):
        assert _get(gateway, ROUTE).status_code == 200
        if i % 10 == 9:
            seen.append(_requests(_scrape(gateway)))


def _settle(gateway: Gateway, expected: int, seen: list[float]) -> str:
    """Scrapes until the count is ``expected`` (a request is counted just after its answer
    leaves), then a few more: it must stay there."""
    deadline = time.monotonic() + 10
    while True:
        text = _scrape(gateway)
        seen.append(_requests(text))
        if seen[-1] >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for _ in range(20):
        text = _scrape(gateway)
        seen.append(_requests(text))
    return text


def _counted_per_worker(gateway: Gateway) -> dict[str, float]:
    """The requests to ROUTE each worker's file holds."""
    counted = {}
    for file in gateway.metrics_dir().glob("counter_requests-*.db"):
        counted[file.name] = sum(
            value
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(file))
            if f'"route": "{ROUTE}"' in key
        )
    return counted


def _monotonic(seen: list[float]) -> None:
    backwards = [(a, b) for a, b in itertools.pairwise(seen) if b < a]
    assert not backwards, f"the counter went back: {backwards} in {seen}"


def test_two_workers_count_every_request_in_one_view(gateway: Gateway) -> None:
    seen: list[float] = []
    _send(gateway, REQUESTS, seen)
    text = _settle(gateway, REQUESTS, seen)
    _monotonic(seen)
    assert seen[-1] == REQUESTS, seen
    # Both workers took requests (else this test shows nothing about combining them), and the
    # exposition is the sum of what each wrote.
    per_worker = _counted_per_worker(gateway)
    assert len(per_worker) == 2 and all(per_worker.values()), per_worker
    assert sum(per_worker.values()) == REQUESTS
    count = _sample(
        text, "jsgw_http_request_duration_seconds_count", f'{{method="GET",route="{ROUTE}"}}'
    )
    assert count == REQUESTS
    assert _sample(text, "jsgw_http_requests_in_flight") == 0
    assert _sample(text, "jsgw_nats_pool_size") == 2 * POOL_SIZE
    assert _sample(text, "jsgw_nats_pool_connections_up") == 2 * POOL_SIZE


def test_a_replaced_worker_is_counted_once(gateway: Gateway) -> None:
    seen: list[float] = []
    _send(gateway, 100, seen)
    _settle(gateway, 100, seen)
    assert seen[-1] == 100, seen
    victim = max(gateway.worker_pids())
    os.kill(victim, signal.SIGKILL)
    # uvicorn's supervisor replaces it; the survivor serves meanwhile.
    _wait_for_workers(gateway, 2, exclude=frozenset({victim}))
    text = _settle(gateway, 100, seen)
    assert seen[-1] == 100, "the dead worker's requests are lost or counted twice"
    # Its live gauges are gone: the pool is two workers' again, not three.
    assert _sample(text, "jsgw_nats_pool_size") == 2 * POOL_SIZE
    assert _sample(text, "jsgw_nats_pool_connections_up") == 2 * POOL_SIZE
    assert _sample(text, "jsgw_http_requests_in_flight") == 0
    _send(gateway, 100, seen)
    _settle(gateway, 200, seen)
    _monotonic(seen)
    assert seen[-1] == 200, seen


def _open_per_worker(gateway: Gateway) -> dict[str, float]:
    """The open SSE streams each live worker's gauge file holds."""
    held = {}
    for file in gateway.metrics_dir().glob("gauge_livesum_*.db"):
        if file.name.endswith("_requests.db"):
            continue
        held[file.name] = sum(
            value
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(file))
            if key.startswith('["jsgw_sse_streams_open"')
        )
    return held


def _streams_open(gateway: Gateway) -> float:
    return _sample(_scrape(gateway), "jsgw_sse_streams_open", '{kind="kv_watch"}')


def test_open_streams_are_summed_over_the_workers(gateway: Gateway, name: str) -> None:
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        assert http.put(f"/v1/kv/{name}", json={}).status_code == 201
    # Both workers started before the test; one replaced since (uvicorn replaces a worker that
    # misses its health check, as on a loaded machine) is missing from the view until its
    # lifespan has run again.
    _wait_for_workers(gateway, 2)
    text = _scrape(gateway)
    assert _sample(text, "jsgw_sse_streams_limit") == 2 * 5000  # JSGW_SSE_MAX_STREAMS each
    assert _sample(text, "jsgw_kv_watches_limit") == 2 * 10_000
    with contextlib.ExitStack() as streams:
        opened = 0
        # A connection each, until both workers hold some (the kernel picks the worker).
        while opened < 4 or sum(1 for n in _open_per_worker(gateway).values() if n) < 2:
            assert opened < 40, _open_per_worker(gateway)
            client = streams.enter_context(httpx.Client(base_url=gateway.url, timeout=10))
            watch = streams.enter_context(client.stream("GET", f"/v1/kv/{name}/watch"))
            assert watch.status_code == 200
            opened += 1
        for _ in range(5):  # whichever worker answers
            assert _streams_open(gateway) == opened
    deadline = time.monotonic() + 10
    while _streams_open(gateway) != 0:
        assert time.monotonic() < deadline, _open_per_worker(gateway)
        time.sleep(0.1)
