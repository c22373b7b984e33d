"""Child processes of a benchmark run: started in their own process group, on loopback only,
and always stopped (SIGTERM to the group, then SIGKILL), also on Ctrl-C or an error.

Every child also gets PR_SET_PDEATHSIG, so none outlives the benchmark if it is killed hard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child (where other threads may hold locks)
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # pragma: no cover - not glibc
    _LIBC = None


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM this child when the benchmark dies (prctl only: safe after fork)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _child_setup() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    die_with_parent()


def free_port() -> int:
    """A free loopback port (never 4222)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 4222:
            return port


class Proc:
    """One child process (and its process group)."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log = log
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.popen = subprocess.Popen(
                self.args,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(cwd or ROOT),
                preexec_fn=_child_setup,  # only setsid and prctl
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        # Workers of a uvicorn supervisor are in the same group: make sure none is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        if not self.log or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Procs:
    """Every child of the run; ``stop_all`` stops them in reverse order of start."""

    def __init__(self) -> None:
        self.items: list[Proc] = []

    def start(self, *args, **kwargs) -> Proc:  # type: ignore[no-untyped-def]
        proc = Proc(*args, **kwargs)
        self.items.append(proc)
        return proc

    def stop_all(self) -> None:
        while self.items:
            proc = self.items.pop()
            with contextlib.suppress(Exception):
                proc.stop()


def start_gateway(
    procs: Procs,
    nats_url: str,
    workdir: Path,
    *,
    workers: int = 1,
    env: dict[str, str] | None = None,
    name: str = "gateway",
) -> tuple[Proc, str]:
    """A gateway (``python -m app serve``) on a free loopback port with its default settings
    but for ``env``, once it answers ``/readyz``: (its process, its base URL)."""
    import secrets

    port = free_port()
    settings = {
        "JSGW_NATS_URL": nats_url,
        "JSGW_HOST": "127.0.0.1",
        "JSGW_PORT": str(port),
        "JSGW_WORKERS": str(workers),
        "JSGW_ACK_SECRET": secrets.token_hex(32),
        "JSGW_DATA_DIR": str(workdir / f"{name}-data"),
        **(env or {}),
    }
    proc = procs.start(
        name, [PYTHON, "-m", "app", "serve"], env=settings, log=workdir / f"{name}.log"
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/readyz", proc, timeout=60)
    return proc, url


def wait_http(
    url: str,
    proc: Proc | None = None,
    timeout: float = 30.0,
    ok: Sequence[int] = (200,),
    data: bytes | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=2) as r:
                if r.status in ok:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    tail = f"\n{proc.tail()}" if proc else ""
    raise RuntimeError(f"{url} not ready within {timeout}s: {last}{tail}")


def tree_pids(pid: int) -> list[int]:
    """pid and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of pid and its descendants, MiB."""
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
    return total / 1024


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # (gone)
        return []


@contextlib.contextmanager
def pinned(pids: list[int], cpus: set[int]) -> Iterator[None]:
    """Every thread of these processes and their descendants on ``cpus`` for the block (as
    ``taskset -ap``), then back on the cores it had; a thread started during the block gets
    the cores its process had."""
    processes = {p for pid in pids for p in tree_pids(pid)}
    before: dict[int, set[int]] = {}  # thread (a process's first thread: its pid) -> cores
    for p in processes:
        for tid in _threads(p):
            with contextlib.suppress(OSError):
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for p in processes:
            for tid in _threads(p):
                cores = before.get(tid, before.get(p))
                if cores is not None:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, cores)


def cpu_seconds(pid: int) -> float:
    """utime+stime of pid and its descendants, seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM to the benchmark behaves like Ctrl-C, so the cleanup code runs."""

    def handler(signum, frame):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    # A benchmark started in the background inherits SIGINT ignored: take it back.
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def machine_busy_seconds() -> float:
    """CPU time spent by everything on the machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = (
        fields[0]
        + fields[1]
        + fields[2]
        + fields[5]
        + fields[6]
        + (fields[7] if len(fields) > 7 else 0)
    )
    return busy / os.sysconf("SC_CLK_TCK")


def run_load(
    module: str, kind: str, url: str, options: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """A load process of ``module`` (``python -m <module> --load <kind> --url <url>`` and
    ``--<name> <value>`` per option): the JSON result it printed last."""
    cmd = [PYTHON, "-m", module, "--load", kind, "--url", url]
    for name, value in options.items():
        cmd += [f"--{name}", str(value)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)
    result: dict[str, Any] = orjson.loads(out.stdout.strip().splitlines()[-1])
    return result


def measured(
    load: Callable[[], dict[str, Any]], speaker: int | None, pids: dict[str, int]
) -> dict[str, Any]:
    """``load()`` (which runs a load process), with the CPU seconds it took of the NATS
    speaker (the gateway; None: the load process speaks NATS itself), of the load process
    and of each of ``pids``, as the result's ``cpu_s``."""
    before = {who: cpu_seconds(pid) for who, pid in pids.items()}
    s0 = cpu_seconds(speaker) if speaker else 0.0
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = load()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    result["cpu_s"] = {
        "speaker": cpu_seconds(speaker) - s0 if speaker else spent,
        "load": spent,
        **{who: cpu_seconds(pid) - before[who] for who, pid in pids.items()},
    }
    return result
