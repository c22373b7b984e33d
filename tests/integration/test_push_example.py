"""docs/push-example.md, run as written: its application (a process of its own), its shell
blocks (bash and curl), its subscription through the API and from a file, against a real
gateway on a real nats-server. The only change made to the page's text is the addresses: the
gateway's and the application's ports are free ones, not 8080 and 3000.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, jsgw_serve, served_gateway

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "push-example.md"
CHART_APP = ROOT / "deploy" / "helm-sidecar-example" / "files" / "orders_app.py"
# The pear's five deliveries, 2 s apart (Retry-After), and the rest.
DEAD_LETTERS_WITHIN = 40.0


def blocks() -> dict[str, str]:
    """The page's code blocks that have a title, by title."""
    found = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```$', PAGE.read_text(), re.M | re.S)
    return dict(found)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Example:
    """Where the page's commands go: the gateway's base URL and the application's port."""

    gateway: str
    app_port: int

    def text(self, title: str) -> str:
        """A block of the page with its addresses replaced."""
        host = self.gateway.removeprefix("http://")
        return (
            blocks()[title]
            .replace("localhost:8080", host)
            .replace("127.0.0.1:3000", f"127.0.0.1:{self.app_port}")
        )

    def sh(self, title: str) -> str:
        """Run a shell block of the page (stopping at its first failing command)."""
        done = subprocess.run(
            ["bash", "-e", "-c", self.text(title)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"{title} failed: {done.stderr}{done.stdout}"
        return done.stdout

    def state(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.gateway}/v1/subscriptions/orders", timeout=5)
        assert answer.status_code == 200, answer.text
        state: dict[str, Any] = answer.json()["state"]
        return state

    def until(self, check: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not check(state := self.state()):
            assert time.monotonic() < deadline, f"not within {timeout} s: {state}"
            time.sleep(0.2)
        return state


@contextmanager
def application(folder: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``python orders_app.py`` as the page writes it, on a free port; stopped on exit."""
    (folder / "orders_app.py").write_text(blocks()["orders_app.py"])
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "orders_app.py"],
        cwd=folder,
        env={"PORT": str(port), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no application"
                time.sleep(0.05)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(10)


def dead_letters(output: str) -> dict[str, dict[str, Any]]:
    """The dead letters read by the page's Direct Get, by their payload."""
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert lines[-1].get("eob") is True, lines[-1]
    return {
        _payload(message["data"]): {k: v[0] for k, v in message["headers"].items()}
        for message in lines[:-1]
    }


def _payload(data: str) -> str:
    return base64.b64decode(data).decode()


def test_the_page_shows_the_application_of_the_helm_example() -> None:
    assert blocks()["orders_app.py"] == CHART_APP.read_text()


@pytest.mark.server("2.11")  # (the dead letters are read by a batched Direct Get)
def test_the_example_through_the_api(own_nats_server: EmbeddedServer, tmp_path: Path) -> None:
    settings = gateway_settings(own_nats_server.url)
    with served_gateway(settings) as gateway, application(tmp_path) as (port, app):
        example = Example(gateway, port)
        example.sh("streams.sh")
        created = json.loads(example.sh("subscribe.sh"))
        assert created["config"]["endpoint"] == f"http://127.0.0.1:{port}/orders"
        assert created["state"]["source"] == "api"
        published = example.sh("orders.sh")
        assert published.count('"seq"') == 4, published

        # (A dead letter is counted once stored, and its message terminated after: the last
        # one is done when nothing is in flight.)
        state = example.until(
            lambda s: s["dead_lettered"] == 3 and s["in_flight"] == 0, DEAD_LETTERS_WITHIN
        )
        # The apple acked; the kiwi, the text and the pear (after 5 deliveries) dead-lettered.
        assert (state["acked"], state["retried"], state["terminated"]) == (1, 4, 3), state
        assert state["delivered"] == 8 and state["in_flight"] == 0, state
        assert (state["num_pending"], state["num_ack_pending"]) == (0, 0), state

        letters = dead_letters(example.sh("dead-letters.sh"))
        reasons = {payload: h["Nats-Dlq-Reason"] for payload, h in letters.items()}
        assert reasons == {
            '{"item": "pear", "quantity": 1}': "max_deliver (5) reached: HTTP 503",
            '{"item": "kiwi", "quantity": 1}': "dropped by the application",
            "an order, surely": "HTTP 422",
        }
        pear = letters['{"item": "pear", "quantity": 1}']
        assert (pear["Nats-Dlq-Stream"], pear["Nats-Dlq-Sequence"]) == ("ORDERS", "2")
        assert (pear["Nats-Dlq-Subject"], pear["Nats-Dlq-Delivered"]) == ("orders.eu", "5")
        assert pear["Nats-Msg-Id"] == "ORDERS:2"
        # The page shows the reasons the gateway gives, and the state it reaches.
        shown = set(re.findall(r'"Nats-Dlq-Reason":\["([^"]+)"\]', PAGE.read_text()))
        assert shown == set(reasons.values()), shown
        for field in ("delivered", "acked", "retried", "terminated", "dead_lettered"):
            assert f'"{field}": {state[field]},' in PAGE.read_text(), field

    out, _ = app.communicate(timeout=10)
    assert out.splitlines() == ["order ORDERS:1: 3 x apple"]


def test_the_example_from_a_file(own_nats_server: EmbeddedServer, tmp_path: Path) -> None:
    """`JSGW_SUBSCRIPTIONS=subscriptions.yaml jsgw serve`: delivered from the start, listed
    as from the file, and not changed through the API."""
    port = free_port()
    gateway = f"http://127.0.0.1:{port}"
    settings = {
        "JSGW_NATS_URL": own_nats_server.url,
        "JSGW_PORT": str(port),
        "JSGW_DATA_DIR": str(tmp_path / "data"),
        "JSGW_SUBSCRIPTIONS": str(tmp_path / "subscriptions.yaml"),
    }
    with application(tmp_path) as (app_port, app):
        example = Example(gateway, app_port)
        (tmp_path / "subscriptions.yaml").write_text(example.text("subscriptions.yaml"))
        log = tmp_path / "gateway.log"
        with jsgw_serve(settings, log, ready=f"{gateway}/readyz"):
            example.sh("streams.sh")
            example.sh("orders.sh")
            state = example.until(
                lambda s: s["acked"] == 1 and s["dead_lettered"] >= 2, DEAD_LETTERS_WITHIN
            )
            assert state["source"] == "file" and state["running"], state
            body = {"stream": "ORDERS", "consumer": "orders-app", "endpoint": "http://x"}
            refused = httpx.put(f"{gateway}/v1/subscriptions/orders", json=body, timeout=5)
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "subscription.declared_in_file"
    out, _ = app.communicate(timeout=10)
    assert out.splitlines() == ["order ORDERS:1: 3 x apple"]


@pytest.fixture(autouse=True)
def _needs_curl() -> None:
    if subprocess.run(["sh", "-c", "command -v curl"], capture_output=True).returncode:
        pytest.skip("the page's commands use curl, which is not installed")
