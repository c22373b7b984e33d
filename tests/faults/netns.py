"""Network partitions for fault tests: a 3-node cluster and a real gateway in network namespaces.

Topology (every address in 198.18.0.0/15, the RFC 2544 benchmarking range)::

                      switch ns: bridge br0 (cluster/route traffic, 198.18.0.0/24)
                     /          |          \\
        n1 198.18.0.1      n2 198.18.0.2      n3 198.18.0.3     (one namespace each)
             \\ 198.18.1.0/30  | .4/30       / .8/30              (client links gw <-> nX)
                            gw ns: `jsgw serve`
        root ns <-> n1, n2, n3, gw: 198.19.K.0/30, .4/30, .8/30, .12/30 (K free per run)

The pytest process lives in the root namespace: it reads the nodes with nats-py and talks HTTP
to the gateway over the root links. A *cut* is ``ip link set <veth> down`` on one end, so the
packets vanish (no RST, no ICMP): the other end keeps its route and its TCP retransmits into
nothing, as across a real partition. Links that share the bridge (node <-> node) are cut with
input ``blackhole`` policy rules on both nodes instead, so two nodes can lose each other while
both still see the third.

Every namespace is named ``jsgwt<pid>-<role>``; a run sweeps those of dead processes left by an
earlier crash. Processes are started with ``ip netns exec`` (which execs the program: the pid we
hold is the program's) and get SIGKILL when the pytest process dies.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors

from app.nats.embedded import find_binary
from tests.cluster import wait_for_meta_leader, wait_for_stream_current

PREFIX = "jsgwt"
NODES = ("n1", "n2", "n3")
ENDPOINTS = (*NODES, "gw", "root", "sw")
CLIENT_PORT = 14222
CLUSTER_PORT = 16222
MONITOR_PORT = 18222
GATEWAY_PORT = 18080
CLUSTER_NAME = "jsgwpart"
VENV_BIN = Path(sys.executable).parent  # the environment running the tests (jsgw installed)

_PR_SET_PDEATHSIG = 1


class HarnessUnavailable(RuntimeError):
    """This machine cannot build the topology (not root, no `ip`, no namespaces)."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(ns: str) -> None:
    """Kill whatever runs inside (it keeps the namespace alive) and delete it."""
    pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", ns, check=False)


def sweep_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose pytest process is gone; their names."""
    listed = _run("ip", "netns", "list", check=False).stdout.splitlines()
    swept = []
    for line in listed:
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            swept.append(name)
    return swept


def check_available() -> None:
    """Raise HarnessUnavailable with the reason when the topology cannot be built here."""
    if os.geteuid() != 0:
        raise HarnessUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise HarnessUnavailable("the `ip` command (iproute2) is missing")
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = _run("ip", "netns", "add", probe, check=False)
    if done.returncode != 0:
        raise HarnessUnavailable(f"`ip netns add` failed: {done.stderr.strip()}")
    _run("ip", "netns", "del", probe, check=False)


@dataclass(frozen=True)
class Link:
    """One veth pair: ``a_if`` in namespace ``a_ns`` (None: root), ``b_if`` in ``b_ns``.

    ``down_ns``/``down_if`` is the end a cut sets down: the other end keeps its address and
    route, so what it sends is lost silently.
    """

    a_ns: str | None
    a_if: str
    a_addr: str | None
    b_ns: str
    b_if: str
    b_addr: str | None
    down_ns: str | None
    down_if: str


class Partition:
    """The topology, its processes, and the faults: see the module docstring.

    Endpoints: ``n1``, ``n2``, ``n3``, ``gw``, ``root``, and ``sw`` (the switch: ``cut("n1",
    "sw")`` is ``isolate("n1")``).
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        request_timeout: float = 3.0,
        gateway_env: dict[str, str] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.nodes = list(NODES)
        self.request_timeout = request_timeout
        self.gateway_env = dict(gateway_env or {})
        self.tag = f"{PREFIX}{os.getpid()}"
        self.ns = {role: f"{self.tag}-{role}" for role in (*NODES, "sw", "gw")}
        self._made: list[str] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._rules: set[tuple[str, str]] = set()  # node pairs cut by policy rules
        self._links: dict[frozenset[str], Link] = {}
        self._down: set[frozenset[str]] = set()
        self._closed = False
        k = self._free_root_subnet()
        self._k = k
        # Addresses.
        self.cluster_addr = {n: f"198.18.0.{i}" for i, n in enumerate(NODES, start=1)}
        self._gw_side = {n: f"198.18.1.{4 * i + 1}" for i, n in enumerate(NODES)}
        self._node_gw_side = {n: f"198.18.1.{4 * i + 2}" for i, n in enumerate(NODES)}
        self._root_side = {n: f"198.19.{k}.{4 * i + 1}" for i, n in enumerate(NODES)}
        self._node_root_side = {n: f"198.19.{k}.{4 * i + 2}" for i, n in enumerate(NODES)}
        self._root_gw = (f"198.19.{k}.13", f"198.19.{k}.14")  # root end, gw end

    # -- addresses seen from each side ------------------------------------------------------

    @property
    def client_urls_from_root(self) -> list[str]:
        return [f"nats://{self._node_root_side[n]}:{CLIENT_PORT}" for n in NODES]

    def client_url_from_root(self, node: str) -> str:
        return f"nats://{self._node_root_side[node]}:{CLIENT_PORT}"

    @property
    def client_urls_from_gw(self) -> list[str]:
        return [f"nats://{self._node_gw_side[n]}:{CLIENT_PORT}" for n in NODES]

    @property
    def gateway_url(self) -> str:
        return f"http://{self._root_gw[1]}:{GATEWAY_PORT}"

    def monitor_url(self, node: str) -> str:
        return f"http://{self._node_root_side[node]}:{MONITOR_PORT}"

    def gateway_addr_towards(self, node: str) -> str:
        """The gateway's address on its link to ``node`` (what that node's connz shows)."""
        return self._gw_side[node]

    @property
    def gateway_log(self) -> Path:
        return self.base_dir / "gateway.log"

    def node_log(self, node: str) -> Path:
        return self.base_dir / node / "server.log"

    # -- building ---------------------------------------------------------------------------

    @staticmethod
    def _free_root_subnet() -> int:
        """A third octet K for 198.19.K.0/24 that no other live run uses in the root namespace."""
        used = set(re.findall(r"inet 198\.19\.(\d+)\.", _run("ip", "-4", "addr").stdout))
        start = os.getpid() % 256
        for k in [(start + i) % 256 for i in range(256)]:
            if str(k) not in used:
                return k
        raise HarnessUnavailable("no free 198.19.K.0/24 in the root namespace")

    def _netns(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "-n", ns, *args, check=check)

    def _add_ns(self, ns: str) -> None:
        done = _run("ip", "netns", "add", ns, check=False)
        if done.returncode != 0:
            raise HarnessUnavailable(f"`ip netns add {ns}` failed: {done.stderr.strip()}")
        self._made.append(ns)
        self._netns(ns, "link", "set", "lo", "up")

    def _veth(self, link: Link, prefix_len: int) -> None:
        if link.a_ns is None:
            # A root-side end named after this process may outlive the previous topology for
            # a moment (a namespace goes when its last process has exited): not reused.
            _run("ip", "link", "del", link.a_if, check=False)
        a = ["name", link.a_if] + (["netns", link.a_ns] if link.a_ns else [])
        _run("ip", "link", "add", *a, "type", "veth", "peer", "name", link.b_if, "netns", link.b_ns)
        for ns, ifname, addr in (
            (link.a_ns, link.a_if, link.a_addr),
            (link.b_ns, link.b_if, link.b_addr),
        ):
            prefix = ["ip", "-n", ns] if ns else ["ip"]
            if addr:
                _run(*prefix, "addr", "add", f"{addr}/{prefix_len}", "dev", ifname)
            _run(*prefix, "link", "set", ifname, "up")

    def build(self) -> None:
        """The namespaces, bridge and links; no process yet."""
        atexit.register(self.close)
        for ns in self.ns.values():
            self._add_ns(ns)
        sw = self.ns["sw"]
        self._netns(sw, "link", "add", "br0", "type", "bridge")
        self._netns(sw, "link", "set", "br0", "up")
        root_tag = f"jt{os.getpid()}"
        for i, node in enumerate(NODES, start=1):
            ns = self.ns[node]
            # cluster: node "cl" <-> bridge port "p<i>" (the port is what isolate() downs)
            cluster = Link(ns, "cl", self.cluster_addr[node], sw, f"p{i}", None, sw, f"p{i}")
            self._veth(cluster, 24)
            self._netns(sw, "link", "set", f"p{i}", "master", "br0")
            self._links[frozenset((node, "sw"))] = cluster
            # client link gw <-> node: the node's end goes down on a cut
            client = Link(
                self.ns["gw"],
                f"to{node}",
                self._gw_side[node],
                ns,
                "gw",
                self._node_gw_side[node],
                ns,
                "gw",
            )
            self._veth(client, 30)
            self._links[frozenset((node, "gw"))] = client
            # root <-> node: the node's end goes down on a cut
            root = Link(
                None,
                f"{root_tag}n{i}",
                self._root_side[node],
                ns,
                "root",
                self._node_root_side[node],
                ns,
                "root",
            )
            self._veth(root, 30)
            self._links[frozenset((node, "root"))] = root
        gw = Link(
            None,
            f"{root_tag}gw",
            self._root_gw[0],
            self.ns["gw"],
            "root",
            self._root_gw[1],
            self.ns["gw"],
            "root",
        )
        self._veth(gw, 30)
        self._links[frozenset(("gw", "root"))] = gw

    # -- processes --------------------------------------------------------------------------

    def _spawn(
        self, key: str, ns: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self._procs[key] = subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent,
            )

    def start_node(self, node: str) -> None:
        others = [n for n in NODES if n != node]
        store = self.base_dir / node / "store"
        store.mkdir(parents=True, exist_ok=True)
        argv = [
            find_binary(),
            "-n",
            node,
            "-a",
            "0.0.0.0",
            "-p",
            str(CLIENT_PORT),
            "-m",
            str(MONITOR_PORT),
            "-js",
            "-sd",
            str(store),
            "--cluster_name",
            CLUSTER_NAME,
            "--cluster",
            f"nats://0.0.0.0:{CLUSTER_PORT}",
            "--cluster_advertise",
            f"{self.cluster_addr[node]}:{CLUSTER_PORT}",
            "--routes",
            ",".join(f"nats://{self.cluster_addr[o]}:{CLUSTER_PORT}" for o in others),
            "--no_advertise",
        ]
        self._spawn(node, self.ns[node], argv, self.node_log(node))

    def _wait_healthy(self, node: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"{self.monitor_url(node)}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            proc = self._procs.get(node)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"{node} exited with {proc.returncode}:\n{self.tail(self.node_log(node))}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(
            f"{node} not healthy after {timeout}s:\n{self.tail(self.node_log(node))}"
        )

    def kill_node(self, node: str) -> None:
        self._stop(node, signal.SIGKILL)

    def restart_node(self, node: str) -> None:
        self._stop(node, signal.SIGTERM)
        self.start_node(node)
        self._wait_healthy(node)

    def gateway_environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JSGW_")}
        env.update(
            JSGW_NATS_URL=",".join(self.client_urls_from_gw),
            JSGW_HOST=self._root_gw[1],
            JSGW_PORT=str(GATEWAY_PORT),
            JSGW_REQUEST_TIMEOUT=str(self.request_timeout),
            JSGW_ALLOW_UNAUTHENTICATED="true",
            JSGW_ACCESS_LOG="false",
            JSGW_LOG_LEVEL="info",
            JSGW_DATA_DIR=str(self.base_dir / "gw-data"),
        )
        env.update(self.gateway_env)
        env.update(extra or {})
        return env

    def start_gateway(self, extra_env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        """``jsgw serve`` in the gw namespace. With ``JSGW_PARTITION_SRC=<dir>`` in the
        environment, the gateway's code is imported from that source tree instead (e.g. a
        ``git worktree`` of another commit), to compare two versions on the same scenarios."""
        env = self.gateway_environment(extra_env)
        argv = [str(VENV_BIN / "jsgw"), "serve"]
        source = os.environ.get("JSGW_PARTITION_SRC")
        if source:
            env["PYTHONPATH"] = source
            argv = [
                str(VENV_BIN / "python"),
                "-c",
                "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "from app.cli import main; sys.exit(main(['serve']))",
                source,
            ]
        self._spawn("gw", self.ns["gw"], argv, self.gateway_log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._procs["gw"].poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.tail(self.gateway_log)}")
            try:
                with urllib.request.urlopen(f"{self.gateway_url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"the gateway was not ready after {timeout}s:\n{self.tail(self.gateway_log)}"
        )

    def kill_gateway(self) -> None:
        self._stop("gw", signal.SIGKILL)

    def restart_gateway(self, extra_env: dict[str, str] | None = None) -> None:
        self._stop("gw", signal.SIGTERM)
        self.start_gateway(extra_env)

    def _stop(self, key: str, sig: int, timeout: float = 10.0) -> None:
        proc = self._procs.pop(key, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def start(self) -> None:
        """Build the topology, start the nodes and the gateway (JetStream ready after it)."""
        self.build()
        for node in NODES:
            self.start_node(node)
        for node in NODES:
            self._wait_healthy(node)
        asyncio.run(self.wait_for_jetstream())
        self.start_gateway()

    def close(self) -> None:
        """Kill every process and delete every namespace made here. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for key in list(self._procs):
            self._stop(key, signal.SIGKILL, timeout=5)
        for ns in reversed(self._made):
            _delete_namespace(ns)
        self._made.clear()
        # The root-side ends, at once (they go with their namespaces, but not synchronously).
        for link in self._links.values():
            if link.a_ns is None:
                _run("ip", "link", "del", link.a_if, check=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    @staticmethod
    def tail(path: Path, lines: int = 40) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return f"({path} does not exist)"

    # -- faults -----------------------------------------------------------------------------

    def _key(self, a: str, b: str) -> frozenset[str]:
        for end in (a, b):
            if end not in ENDPOINTS:
                raise ValueError(f"unknown endpoint {end!r} (one of {ENDPOINTS})")
        if a == b:
            raise ValueError("a link joins two different endpoints")
        return frozenset((a, b))

    def _set_pair_rules(self, a: str, b: str, add: bool) -> None:
        """Cut or heal two nodes on the bridge: each drops what it receives from the other."""
        for me, peer in ((a, b), (b, a)):
            verb = "add" if add else "del"
            self._netns(
                self.ns[me],
                "rule",
                verb,
                "from",
                self.cluster_addr[peer],
                "iif",
                "cl",
                "blackhole",
                "pref",
                "100",
                check=add,
            )

    def cut(self, a: str, b: str) -> None:
        """Cut the link between two endpoints: packets vanish both ways (no RST, no ICMP)."""
        key = self._key(a, b)
        if key in self._down:
            return
        if a in NODES and b in NODES:
            self._set_pair_rules(a, b, add=True)
        else:
            link = self._links.get(key)
            if link is None:
                raise ValueError(f"no link between {a} and {b}")
            prefix = ["ip", "-n", link.down_ns] if link.down_ns else ["ip"]
            _run(*prefix, "link", "set", link.down_if, "down")
        self._down.add(key)

    def heal(self, a: str, b: str) -> None:
        key = self._key(a, b)
        if key not in self._down:
            return
        if a in NODES and b in NODES:
            self._set_pair_rules(a, b, add=False)
        else:
            link = self._links[key]
            prefix = ["ip", "-n", link.down_ns] if link.down_ns else ["ip"]
            _run(*prefix, "link", "set", link.down_if, "up")
        self._down.discard(key)

    def isolate(self, node: str) -> None:
        """Cut the node's cluster link: it loses both other nodes; its client links stay."""
        self.cut(node, "sw")

    def rejoin(self, node: str) -> None:
        self.heal(node, "sw")

    def heal_all(self) -> None:
        for key in list(self._down):
            a, b = sorted(key)
            self.heal(a, b)

    def lag(self, node: str, seconds: float, rate: str = "256kbit") -> None:
        """Queue what the cluster sends ``node`` for up to ``seconds`` (0: not at all): a
        token bucket on its switch port that passes ``rate``, so that a load above it keeps
        the queue full. Its replicas then apply what the others committed that much later: a
        replica behind that still answers, its client links untouched. (A token bucket, as
        netem is not in every kernel.)"""
        port = self._links[frozenset((node, "sw"))].b_if
        tc = ["tc", "-n", self.ns["sw"], "qdisc"]
        _run(*tc, "del", "dev", port, "root", check=False)
        if seconds > 0:
            queue = f"{int(seconds * 1000)}ms"
            bucket = ["tbf", "rate", rate, "burst", "4kb", "latency", queue]
            _run(*tc, "add", "dev", port, "root", *bucket)

    @property
    def cut_links(self) -> list[tuple[str, str]]:
        return sorted(tuple(sorted(k)) for k in self._down)  # type: ignore[misc]

    async def flap(
        self, link: tuple[str, str], period: float, duration: float, down_fraction: float = 0.5
    ) -> int:
        """Cut and heal ``link`` every ``period`` s (down ``down_fraction`` of it) for
        ``duration`` s; it ends healed. Returns how many times it was cut."""
        a, b = link
        end = time.monotonic() + duration
        cuts = 0
        try:
            while time.monotonic() < end:
                await asyncio.to_thread(self.cut, a, b)
                cuts += 1
                await asyncio.sleep(min(period * down_fraction, max(0.0, end - time.monotonic())))
                await asyncio.to_thread(self.heal, a, b)
                await asyncio.sleep(
                    min(period * (1 - down_fraction), max(0.0, end - time.monotonic()))
                )
        finally:
            self.heal(a, b)
        return cuts

    # -- JetStream, read from the root namespace --------------------------------------------

    async def _connect(self, node: str | None = None) -> nats.NATS:
        urls = [self.client_url_from_root(node)] if node else self.client_urls_from_root
        return await nats.connect(
            urls, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.2
        )

    async def wait_for_jetstream(self, timeout: float = 30.0) -> None:
        """Until there is a meta leader that can place an R3 stream."""
        nc = await self._connect()
        try:
            await wait_for_meta_leader(nc, 3, timeout)
        finally:
            await nc.close()

    async def stream_info(self, stream: str, via: str | None = None, timeout: float = 2.0) -> dict:
        nc = await self._connect(via)
        try:
            reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", timeout=timeout)
            return json.loads(reply.data)
        finally:
            await nc.close()

    async def consumer_info(self, stream: str, consumer: str, via: str | None = None) -> dict:
        nc = await self._connect(via)
        try:
            reply = await nc.request(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}", timeout=2)
            return json.loads(reply.data)
        finally:
            await nc.close()

    async def stream_leader(
        self,
        stream: str,
        *,
        other_than: str | None = None,
        via: str | None = None,
        timeout: float = 15.0,
    ) -> str:
        """The stream's leader as STREAM.INFO reports it (asked from root over nats-py)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                info = await self.stream_info(stream, via)
                leader = (info.get("cluster") or {}).get("leader")
                if leader and leader != other_than:
                    return leader
                last = info.get("error") or info.get("cluster")
            except (nats.errors.Error, OSError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
        raise AssertionError(f"no leader for {stream} (other than {other_than}): {last}")

    async def move_leader(
        self, stream: str, to: str, consumer: str | None = None, timeout: float = 20.0
    ) -> None:
        """Step the stream's (or its consumer's) leader down in favour of ``to``."""
        subject = (
            f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"
            if consumer
            else f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
        )
        info_subject = (
            f"$JS.API.CONSUMER.INFO.{stream}.{consumer}"
            if consumer
            else f"$JS.API.STREAM.INFO.{stream}"
        )
        body = json.dumps({"placement": {"preferred": to}}).encode()
        deadline = time.monotonic() + timeout
        nc = await self._connect()
        last: object = None
        try:
            while time.monotonic() < deadline:
                try:
                    info = json.loads((await nc.request(info_subject, timeout=2)).data)
                    cluster = info.get("cluster") or {}
                    replicas = cluster.get("replicas") or []
                    if cluster.get("leader") == to and all(r.get("current") for r in replicas):
                        return
                    last = cluster or info.get("error")
                    if cluster.get("leader") and cluster.get("leader") != to:
                        reply = json.loads((await nc.request(subject, body, timeout=3)).data)
                        last = reply.get("error", last)
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                    last = repr(exc)
                await asyncio.sleep(0.3)
        finally:
            await nc.close()
        raise AssertionError(f"could not move the leader of {stream}/{consumer} to {to}: {last}")

    async def wait_stream_current(self, stream: str, timeout: float = 30.0) -> dict:
        """Until the stream has a leader and both other replicas are current."""
        nc = await self._connect()
        try:
            return await wait_for_stream_current(nc, stream, 3, timeout)
        finally:
            await nc.close()

    def meta_leader(self) -> str | None:
        """The JetStream meta leader, as the first node that answers its /jsz says."""
        for node in NODES:
            try:
                with urllib.request.urlopen(f"{self.monitor_url(node)}/jsz", timeout=2) as r:
                    return (json.loads(r.read()).get("meta_cluster") or {}).get("leader")
            except OSError:
                continue
        return None

    def leader_views(self, stream: str) -> dict[str, str | None]:
        """Who each node believes leads ``stream`` (its own /jsz view; None: no leader known,
        "?" : the node did not answer)."""
        views: dict[str, str | None] = {}
        for node in NODES:
            try:
                with urllib.request.urlopen(
                    f"{self.monitor_url(node)}/jsz?streams=true", timeout=2
                ) as r:
                    data = json.loads(r.read())
            except OSError:
                views[node] = "?"
                continue
            views[node] = None
            for account in data.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") == stream:
                        views[node] = (detail.get("cluster") or {}).get("leader") or None
        return views

    def gateway_connections(self) -> dict[str, int]:
        """How many client connections the gateway holds to each node (from each /connz)."""
        out = {}
        for node in NODES:
            try:
                with urllib.request.urlopen(
                    f"{self.monitor_url(node)}/connz?limit=1024", timeout=2
                ) as r:
                    conns = json.loads(r.read()).get("connections") or []
            except OSError:
                out[node] = -1
                continue
            out[node] = sum(1 for c in conns if c.get("ip") == self._gw_side[node])
        return out


@contextlib.contextmanager
def partition(base_dir: Path, **kwargs: object) -> Iterator[Partition]:
    """The whole topology running (nodes, JetStream, gateway); torn down even on failure."""
    check_available()
    sweep_leftovers()
    harness = Partition(base_dir, **kwargs)  # type: ignore[arg-type]
    try:
        harness.start()
        yield harness
    finally:
        harness.close()
