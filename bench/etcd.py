"""etcd (Debian's ``etcd-server``: ``apt-get install -y etcd-server``) as a comparison point:
a single member on loopback ports with a temporary data dir, 1,000 keys preloaded through its
v3 JSON gateway (``POST /v3/kv/put``, base64 keys and values; reads with ``/v3/kv/range``,
``"serializable": true`` for serializable reads). etcd fsyncs every write; nats-server by
default does not (it syncs every 2 minutes), which docs/performance.md's table says next to PUT.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

from bench.procs import Proc, Procs, free_port, wait_http

INSTALL_HINT = "apt-get install -y etcd-server"


def find() -> str | None:
    for candidate in (shutil.which("etcd"), "/usr/bin/etcd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def version(binary: str) -> str:
    try:
        out = subprocess.run(
            [binary, "--version"], check=False, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.splitlines()[0].split(":", 1)[-1].strip() if out else "?"


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def start(procs: Procs, binary: str, workdir: Path) -> tuple[Proc, str]:
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    data = workdir / "etcd-data"
    proc = procs.start(
        "etcd",
        [
            binary,
            "--name",
            "bench",
            "--data-dir",
            str(data),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"bench={peer_url}",
            "--initial-cluster-state",
            "new",
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ],
        log=workdir / "etcd.log",
    )
    wait_http(f"{client_url}/health", proc, timeout=30)
    return proc, client_url


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def preload(url: str, keys: list[str], value: bytes) -> None:
    for key in keys:
        post(url, "/v3/kv/put", {"key": b64(key), "value": b64(value)})
    got = post(url, "/v3/kv/range", {"key": b64(keys[-1])})
    if int(got.get("count", 0)) != 1:
        raise RuntimeError(f"etcd preload check failed: {got}")
