"""The clients of a partition scenario, all HTTP to the gateway, and the check of what they saw.

Every answer is recorded (``History``); when the load is over and the cluster healed, what was
stored is read back with nats-py from the root namespace, independently of the gateway, and
compared with what the clients were told:

- **publishers** publish with a fresh ``Nats-Msg-Id`` each and retry it until a 2xx (or the run
  ends): every acked id must be stored at its acked sequence, no id stored twice;
- **CAS counters**: several key *slots*; writers GET a key's entry and ``PUT If-Match`` its
  ``n + 1`` with a unique attempt id ``w``. A key is retired at ``n == CAP`` (a new generation
  key takes over) so that no key outgrows the bucket's history of 64 and every stored revision
  stays readable: each stored write is traced to the HTTP answer its attempt got. Lost update:
  an acked attempt not stored at its revision, or two stored writes with the same ``n``.
  Refused but stored: an attempt answered 412 whose write is in the history;
- **readers**: KV GETs (staleness in acked revisions behind), Direct Get of the stream from
  the leader (``consistency=leader``: an acked sequence must be found) and from any replica;
- a **KV watch** over SSE, resumed with ``Last-Event-ID`` as an EventSource does: every
  revision of its bucket seen once, in order;
- a **consume** stream (SSE) acking what it gets: every stored message delivered and acked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.faults.history import Call, History, stored_messages

CAP = 50  # a CAS key is retired at this n: at most 51 revisions < the bucket's history 64
WATCH_ROTATE = 6.0  # s: the watch client drops its connection and resumes this often
MARGIN = 1.5  # an answer later than the gateway's request timeout + this is a failure

# Statuses each operation may answer (besides 503/504 problems, allowed everywhere).
ALLOWED: dict[str, set[int]] = {
    "publish": {200},
    "kv.get": {200, 404},  # 404: a new generation key not yet created or not yet replicated
    "kv.create": {201, 412},
    "kv.cas": {200, 412},
    "kv.read": {200, 404},
    "kv.read.leader": {200, 404},
    "direct.leader": {200, 404},  # 404 is recorded as a stale leader read
    "direct.replica": {200, 404},
    "watch.put": {200},
    "watch.open": {200},
    "consume.open": {200},
    "ack": {200},
}
UNKNOWN = {503, 504}
FAILED = {0, 500, 502, 503, 504}  # 0: no HTTP answer (client timeout, connection error)
SSE_OPS = {"watch.open", "consume.open"}


@dataclass
class Attempt:
    """One KV write attempt (create or CAS) and what the gateway answered."""

    id: str
    key: str
    n: int
    status: int
    code: str | None
    revision: int | None  # the answered revision (2xx)
    started: float = 0.0
    ended: float = 0.0
    detail: str | None = None


@dataclass
class Figures:
    scenario: str = ""
    seconds: float = 0.0
    requests: int = 0
    publishes_acked: int = 0
    acked_lost: int = 0
    duplicate_msg_ids: int = 0
    duplicate_first_acks: int = 0
    cas_200: int = 0
    cas_412: int = 0
    cas_unknown: int = 0
    cas_stored: int = 0
    cas_lost: int = 0
    refused_but_stored: int = 0
    refused_but_stored_by_count: int = 0
    watch_events: int = 0
    watch_missed: int = 0
    watch_repeated: int = 0
    watch_reconnects: int = 0
    consume_missing: int = 0  # stored, never delivered to the consume stream
    consume_unconfirmed_acks: int = 0  # delivered, ack never confirmed (even after retries)
    consume_redelivered: int = 0
    stale_kv_reads: int = 0
    stale_kv_max: int = 0
    stale_kv_leader_reads: int = 0  # consistency=leader reads that missed an acked revision
    stale_kv_leader_max: int = 0
    stale_replica_max: int = 0
    stale_leader_reads: int = 0
    heal_to_first_success: float | None = None
    heal_to_all_success: float | None = None
    fault_to_steady: float | None = None  # during the fault: time until every request succeeds
    full_timeout_waits: int = 0
    full_timeout_waits_late: int = 0  # of those, started > 10 s into the fault
    slow_answers: int = 0
    max_latency: float = 0.0
    unexpected: int = 0
    unexpected_by_kind: dict[str, int] = field(default_factory=dict)
    errors_by_code: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = []
        for key, value in asdict(self).items():
            if key in ("examples", "notes") or value in (None, {}, []):
                continue
            rows.append(f"  {key:<28} {round(value, 2) if isinstance(value, float) else value}")
        rows += [f"  note: {n}" for n in self.notes] + [f"  e.g. {e}" for e in self.examples[:12]]
        return f"figures of {self.scenario}:\n" + "\n".join(rows)

    def json_line(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "examples"})


@dataclass
class Timeline:
    """When the faults started and ended (monotonic)."""

    fault_at: float | None = None
    heal_at: float | None = None
    events: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> float:
        now = time.monotonic()
        self.events.append((now, what))
        return now


def _since(moment: float | None) -> float | None:
    return None if moment is None else round(time.monotonic() - moment, 1)


def _entry_value(body: dict) -> dict:
    return json.loads(base64.b64decode(body["value"]))


class Workload:
    """Start with ``await setup()``, then ``start()``; ``await stop()``; ``await check()``."""

    def __init__(
        self,
        gateway_url: str,
        *,
        request_timeout: float = 3.0,
        publishers: int = 3,
        cas_slots: int = 4,
        cas_writers: int = 2,
        kv_readers: int = 2,
        pace: float = 0.05,
        label: str | None = None,
    ) -> None:
        tag = label or uuid.uuid4().hex[:8]
        self.stream = f"S{tag}"
        self.counters = f"C{tag}"
        self.watched = f"W{tag}"
        self.consumer = "c1"
        self.url = gateway_url
        self.request_timeout = request_timeout
        self.publishers, self.cas_slots, self.cas_writers = publishers, cas_slots, cas_writers
        self.kv_readers = kv_readers
        self.pace = pace
        self.history = History()
        self.timeline = Timeline()
        self.unexpected: list[str] = []
        self.unexpected_kinds: Counter[str] = Counter()
        self.notes: list[str] = []
        self.stop_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self._stopped = False
        # publishes
        self.acked: dict[str, int] = {}  # msg id -> seq
        # msg id -> (tries, duplicate, the PubAck's stream, seconds after the fault, if any)
        self.ack_detail: dict[str, tuple[int, bool, str, float | None]] = {}
        self.acked_order: list[tuple[int, str, float]] = []  # (seq, id, answered at)
        self.dup_first: list[str] = []
        # CAS
        self.gen = [0] * cas_slots
        self.attempts: list[Attempt] = []
        self.acked_revs: dict[str, list[tuple[int, float]]] = defaultdict(list)  # key -> (rev, at)
        self.stale_kv: list[int] = []
        self.stale_kv_leader: list[int] = []
        self.stale_replica: list[int] = []
        self.stale_leader = 0
        # watch
        self.watch_acked: list[int] = []
        self.watch_seen: list[int] = []
        self.watch_repeated = 0
        self.watch_reconnects = 0
        self.watch_last_id: str | None = None
        # consume
        self.delivered: Counter[int] = Counter()
        self.consume_acked: set[int] = set()
        self._ack_queue: list[tuple[int, str, int]] = []  # (seq, ack token, tries)
        self.watch_done = asyncio.Event()
        self.consume_done = asyncio.Event()
        self.acker_done = asyncio.Event()

    # -- HTTP and recording -----------------------------------------------------------------

    @property
    def client_timeout(self) -> float:
        return self.request_timeout + 3.0

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            timeout=kwargs.pop("timeout", self.client_timeout),
            # Idle connections are dropped before the gateway's keep-alive timeout (5 s) ends
            # them: at the same 5 s (httpx's default) a request sent on a connection the
            # server is closing meets "Server disconnected without sending a response".
            limits=httpx.Limits(
                max_connections=200, max_keepalive_connections=50, keepalive_expiry=2.0
            ),
            **kwargs,
        )

    def _flag(self, op: str, status: int, code: str | None, text: str) -> None:
        self.unexpected.append(f"{op} {status} {code} {text[:160]}")
        self.unexpected_kinds[f"{op} {status} {code}"] += 1

    def _record(self, op: str, started: float, response: httpx.Response) -> Call:
        call = (
            self.history.record(op, started, response)
            if response.is_success
            or response.headers.get("content-type", "").startswith("application/problem+json")
            else self._append(op, started, response.status_code, "not-problem+json")
        )
        if response.status_code not in ALLOWED[op] | UNKNOWN or call.code == "not-problem+json":
            self._flag(op, response.status_code, call.code, call.detail or response.text)
        return call

    def _append(self, op: str, started: float, status: int, code: str, detail: str = "") -> Call:
        call = Call(op, status, code, started, time.monotonic(), None, detail)
        self.history.calls.append(call)
        return call

    async def request(
        self, op: str, method: str, path: str, **kwargs: Any
    ) -> httpx.Response | None:
        """One request, recorded; None when no HTTP answer came (recorded as status 0)."""
        assert self._http is not None
        started = time.monotonic()
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self._append(op, started, 0, f"client.{type(exc).__name__}", str(exc)[:200])
            self._flag(
                op,
                0,
                f"client.{type(exc).__name__}",
                f"no answer after {time.monotonic() - started:.1f}s: {exc!r}",
            )
            return None
        self._record(op, started, response)
        return response

    # -- set-up -----------------------------------------------------------------------------

    async def setup(self) -> None:
        async with self.client(timeout=30) as http:
            created = await http.put(
                f"/v1/streams/{self.stream}",
                json={
                    "subjects": [f"{self.stream}.>"],
                    "num_replicas": 3,
                    "duplicate_window": "2m",
                    "allow_direct": True,
                },
            )
            assert created.status_code == 201, created.text
            for bucket in (self.counters, self.watched):
                made = await http.put(f"/v1/kv/{bucket}", json={"history": 64, "replicas": 3})
                assert made.status_code == 201, made.text
            consumer = await http.put(
                f"/v1/streams/{self.stream}/consumers/{self.consumer}",
                json={"ack_policy": "explicit", "ack_wait": "4s", "num_replicas": 3},
            )
            assert consumer.status_code == 201, consumer.text

    @property
    def streams(self) -> list[str]:
        return [self.stream, f"KV_{self.counters}", f"KV_{self.watched}"]

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        self._http = self.client()
        jobs: list[Callable[[], Any]] = []
        jobs += [lambda i=i: self._publisher(i) for i in range(self.publishers)]
        jobs += [
            lambda s=s, w=w: self._cas_writer(s, w)
            for s in range(self.cas_slots)
            for w in range(self.cas_writers)
        ]
        jobs += [lambda r=r: self._kv_reader(r) for r in range(self.kv_readers)]
        jobs += [self._leader_reader, self._replica_reader, self._watch_writer, self._watcher]
        jobs += [self._consumer, self._acker]
        self._tasks = [asyncio.create_task(job()) for job in jobs]

    async def stop(self) -> None:
        """Stop every client (``catch_up`` first lets the watch and the consumer catch up)."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_event.set()
        for event in (self.watch_done, self.consume_done, self.acker_done):
            event.set()
        done, pending = await asyncio.wait(self._tasks, timeout=self.client_timeout + 2)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                self._flag("client", 0, "task-crashed", repr(task.exception()))
        if self._http is not None:
            await self._http.aclose()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), seconds)

    async def _publisher(self, index: int) -> None:
        subject = f"{self.stream}.p{index}"
        number = 0
        while not self.stop_event.is_set():
            msg_id = f"p{index}-{number}"
            number += 1
            tries = 0
            while not self.stop_event.is_set():
                tries += 1
                response = await self.request(
                    "publish",
                    "POST",
                    f"/v1/publish/{subject}",
                    content=msg_id.encode(),
                    headers={"Nats-Msg-Id": msg_id},
                )
                if response is not None and response.status_code == 200:
                    ack = response.json()
                    if ack.get("duplicate") and tries == 1:
                        self.dup_first.append(msg_id)
                    self.acked[msg_id] = ack["seq"]
                    self.ack_detail[msg_id] = (
                        tries,
                        bool(ack.get("duplicate")),
                        str(ack.get("stream")),
                        _since(self.timeline.fault_at),
                    )
                    self.acked_order.append((ack["seq"], msg_id, time.monotonic()))
                    break
                await self._sleep(0.1)
            await self._sleep(self.pace)

    def _key(self, slot: int) -> str:
        return f"k{slot}g{self.gen[slot]}"

    async def _write(self, key: str, n: int, headers: dict[str, str], op: str) -> None:
        write_id = uuid.uuid4().hex[:12]
        started = time.monotonic()
        response = await self.request(
            op,
            "PUT",
            f"/v1/kv/{self.counters}/keys/{key}",
            content=json.dumps({"n": n, "w": write_id}).encode(),
            headers=headers,
        )
        status = response.status_code if response is not None else 0
        last = self.history.calls[-1]
        code, detail = (last.code, last.detail) if status not in (200, 201) else (None, None)
        revision = None
        if response is not None and status in (200, 201):
            revision = response.json()["revision"]
            self.acked_revs[key].append((revision, time.monotonic()))
        self.attempts.append(
            Attempt(write_id, key, n, status, code, revision, started, time.monotonic(), detail)
        )

    async def _cas_writer(self, slot: int, writer: int) -> None:
        await asyncio.sleep(random.random() * 0.1)
        while not self.stop_event.is_set():
            gen = self.gen[slot]
            key = self._key(slot)
            response = await self.request(
                "kv.get",
                "GET",
                f"/v1/kv/{self.counters}/keys/{key}",
                headers={"Accept": "application/json"},
            )
            if response is None or response.status_code not in (200, 404):
                await self._sleep(0.1)
                continue
            if response.status_code == 404:
                await self._write(key, 0, {"If-None-Match": "*"}, "kv.create")
                await self._sleep(self.pace)
                continue
            body = response.json()
            n = _entry_value(body)["n"]
            if n >= CAP:
                self.gen[slot] = max(self.gen[slot], gen + 1)
                continue
            await self._write(key, n + 1, {"If-Match": f'"{body["revision"]}"'}, "kv.cas")
            await self._sleep(self.pace)

    async def _kv_reader(self, index: int) -> None:
        """Odd readers ask for ``consistency=leader`` (read-your-writes), even ones any replica."""
        leader = index % 2 == 1
        op, stale = (
            ("kv.read.leader", self.stale_kv_leader) if leader else ("kv.read", self.stale_kv)
        )
        params = {"consistency": "leader"} if leader else {}
        while not self.stop_event.is_set():
            key = self._key(random.randrange(self.cas_slots))
            started = time.monotonic()
            before = [rev for rev, at in self.acked_revs.get(key, []) if at < started]
            response = await self.request(
                op,
                "GET",
                f"/v1/kv/{self.counters}/keys/{key}",
                params=params,
                headers={"Accept": "application/json"},
            )
            if response is not None and response.status_code in (200, 404):
                seen = response.json()["revision"] if response.status_code == 200 else 0
                behind = sum(1 for rev in before if rev > seen)
                if behind:
                    stale.append(behind)
            await self._sleep(self.pace)

    async def _leader_reader(self) -> None:
        """Read-after-write: the latest acked publish, from the leader, must be there."""
        while not self.stop_event.is_set():
            if not self.acked_order:
                await self._sleep(0.1)
                continue
            seq, msg_id, _ = max(self.acked_order)
            response = await self.request(
                "direct.leader",
                "GET",
                f"/v1/streams/{self.stream}/direct",
                params={"seq": seq, "consistency": "leader"},
                headers={"Accept": "application/json"},
            )
            if response is not None and response.status_code == 404:
                self.stale_leader += 1
            elif response is not None and response.status_code == 200:
                message = response.json()
                if base64.b64decode(message["data"]).decode() != msg_id:
                    self._flag(
                        "direct.leader",
                        200,
                        "wrong-message",
                        f"seq {seq}: {message} is not {msg_id}",
                    )
            await self._sleep(self.pace * 2)

    async def _replica_reader(self) -> None:
        subject = f"{self.stream}.p0"
        while not self.stop_event.is_set():
            started = time.monotonic()
            before = [
                s for s, i, at in list(self.acked_order) if at < started and i.startswith("p0-")
            ]
            response = await self.request(
                "direct.replica",
                "GET",
                f"/v1/streams/{self.stream}/direct",
                params={"last_by_subj": subject},
                headers={"Accept": "application/json"},
            )
            if response is not None and response.status_code in (200, 404):
                seen = response.json()["seq"] if response.status_code == 200 else 0
                behind = sum(1 for s in before if s > seen)
                if behind:
                    self.stale_replica.append(behind)
            await self._sleep(self.pace * 2)

    async def _watch_writer(self) -> None:
        number = 0
        while not self.stop_event.is_set():
            response = await self.request(
                "watch.put",
                "PUT",
                f"/v1/kv/{self.watched}/keys/w{number % 40}",
                content=json.dumps({"j": number}).encode(),
            )
            number += 1
            if response is not None and response.status_code == 200:
                self.watch_acked.append(response.json()["revision"])
            await self._sleep(self.pace * 3)

    async def _sse(
        self, op: str, path: str, params: dict[str, Any], headers: dict[str, str], watch: bool
    ) -> AsyncIterator[tuple[str | None, str, str]]:
        """One SSE connection: (id, event, data) per event, until it ends or breaks."""
        timeout = httpx.Timeout(self.client_timeout, read=30.0)
        async with self.client(timeout=timeout) as http:
            started = time.monotonic()
            try:
                async with http.stream("GET", path, params=params, headers=headers) as response:
                    if response.status_code != 200:
                        await response.aread()
                    self._record(op, started, response)
                    if response.status_code != 200:
                        return
                    event_id, event, data = None, "message", []
                    async for line in response.aiter_lines():
                        if self.stop_event.is_set() and not watch:
                            return
                        if line == "":
                            if data or event != "message":
                                yield event_id, event, "\n".join(data)
                            event_id, event, data = None, "message", []
                        elif line.startswith(":"):
                            continue
                        else:
                            name, _, value = line.partition(":")
                            value = value[1:] if value.startswith(" ") else value
                            if name == "id":
                                event_id = value
                            elif name == "event":
                                event = value
                            elif name == "data":
                                data.append(value)
            except httpx.HTTPError as exc:
                if time.monotonic() - started < 0.5:
                    self._append(op, started, 0, f"client.{type(exc).__name__}", str(exc)[:200])
                self.notes.append(
                    f"{op} broke after {time.monotonic() - started:.1f}s: {exc!r}"[:200]
                )

    async def _watcher(self) -> None:
        """An EventSource: reconnects with Last-Event-ID, checks revisions only go up. It also
        drops its connection every ``WATCH_ROTATE`` s (as a page reload would), so resuming is
        exercised whether or not a fault breaks the stream."""
        first = True
        while not self.watch_done.is_set():
            headers = {"Last-Event-ID": self.watch_last_id} if self.watch_last_id else {}
            if not first:
                self.watch_reconnects += 1
            first = False
            opened = time.monotonic()
            events = self._sse(
                "watch.open", f"/v1/kv/{self.watched}/watch", {}, headers, watch=True
            )
            async with contextlib.aclosing(events):
                async for event_id, event, data in events:
                    self._watch_event(event_id, event, data)
                    if self.watch_done.is_set() or time.monotonic() - opened > WATCH_ROTATE:
                        break
            if not self.watch_done.is_set():
                await asyncio.sleep(0.5)

    def _watch_event(self, event_id: str | None, event: str, data: str) -> None:
        if event_id is not None:
            self.watch_last_id = event_id
        if event in ("put", "delete", "purge"):
            revision = json.loads(data)["revision"]
            if self.watch_seen and revision <= max(self.watch_seen):
                self.watch_repeated += 1
            self.watch_seen.append(revision)
        elif event == "error":
            self.notes.append(f"watch error event: {data[:200]}")

    async def _consumer(self) -> None:
        path = f"/v1/streams/{self.stream}/consumers/{self.consumer}/consume"
        params = {"max_messages": 50, "expires": "10s"}
        while not self.consume_done.is_set():
            events = self._sse("consume.open", path, params, {}, watch=True)
            async with contextlib.aclosing(events):
                async for _, event, data in events:
                    if event == "message":
                        message = json.loads(data)
                        self.delivered[message["seq"]] += 1
                        self._ack_queue.append((message["seq"], message["ack_token"], 1))
                    elif event in ("error", "warning"):
                        self.notes.append(f"consume {event}: {data[:160]}")
                    if self.consume_done.is_set():
                        break
            if not self.consume_done.is_set():
                await asyncio.sleep(0.5)

    async def _acker(self) -> None:
        """Acks what the consumer delivered; an ack not confirmed (an error result, a 503/504,
        no answer) is sent again, up to 5 times, as docs/api/consumers.md asks."""
        path = f"/v1/streams/{self.stream}/consumers/{self.consumer}/ack"
        while not self.acker_done.is_set():
            batch, self._ack_queue = self._ack_queue[:200], self._ack_queue[200:]
            if not batch:
                await asyncio.sleep(0.2)
                continue
            response = await self.request(
                "ack", "POST", path, json={"acks": [{"token": t} for _, t, _ in batch]}
            )
            results = (
                response.json()["results"]
                if response is not None and response.status_code == 200
                else [{}] * len(batch)
            )
            retry = []
            for (seq, token, tries), result in zip(batch, results, strict=True):
                if result.get("ok"):
                    self.consume_acked.add(seq)
                elif tries < 5:
                    retry.append((seq, token, tries + 1))
            if retry:
                await asyncio.sleep(0.2)
                self._ack_queue.extend(retry)

    # -- recovery ---------------------------------------------------------------------------

    def failures_since(self, since: float) -> list[Call]:
        return [
            c
            for c in self.history.calls
            if c.started >= since and c.status in FAILED and c.op not in SSE_OPS
        ]

    async def until_recovered(self, since: float, bound: float, quiet: float = 2.0) -> float | None:
        """Keep the load on until requests started after ``since`` have all succeeded for
        ``quiet`` s (and some did); the time from ``since`` to the last failure, or None if
        that did not happen within ``bound`` + ``quiet`` s."""
        deadline = since + bound + quiet
        while time.monotonic() < deadline:
            failed = self.failures_since(since)
            last = max((c.ended for c in failed), default=since)
            ok = [c for c in self.history.calls if c.started > last and 200 <= c.status < 300]
            if time.monotonic() - last >= quiet and ok:
                return last - since
            await asyncio.sleep(0.2)
        return None

    async def catch_up(self, expected_watch: int, expected_seqs: set[int], timeout: float) -> None:
        """After the writers stopped: let the watch and the consumer see everything."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            watch_ok = not expected_watch or (
                self.watch_seen and max(self.watch_seen) >= expected_watch
            )
            if watch_ok and expected_seqs <= self.delivered.keys() and not self._ack_queue:
                break
            await asyncio.sleep(0.2)
        for event in (self.watch_done, self.consume_done, self.acker_done):
            event.set()

    # -- the check --------------------------------------------------------------------------

    async def check(self, harness: Any, scenario: str, catch_up: float = 15.0) -> Figures:
        """Stop the load, wait for the healed cluster, read back, compute the figures."""
        self.stop_event.set()
        for stream in self.streams:
            await harness.wait_stream_current(stream)
        urls = harness.client_urls_from_root
        published = await stored_messages(urls, self.stream)
        watched = await stored_messages(urls, f"KV_{self.watched}")
        await self.catch_up(
            max((m["seq"] for m in watched), default=0), {m["seq"] for m in published}, catch_up
        )
        await self.stop()
        counters = await stored_messages(urls, f"KV_{self.counters}")
        figures = self._figures(scenario, published, watched, counters)
        async with self.client() as http:
            exported = (await http.get("/metrics")).text
        stale = re.search(r"^jsgw_kv_stale_reads_total (\S+)$", exported, re.MULTILINE)
        # KV reads and watch catch-ups that a replica behind answered, redone by the leader
        figures.notes.append(f"stale reads redone: {stale.group(1) if stale else '?'}")
        completed = Path(harness.gateway_log).read_text().count("read from the stream leader")
        figures.notes.append(f"watch catch-ups completed from the leader: {completed}")
        if figures.consume_missing:
            missing = sorted({m["seq"] for m in published} - self.delivered.keys())
            info = await harness.consumer_info(self.stream, self.consumer)
            state = {
                k: info.get(k)
                for k in (
                    "delivered",
                    "ack_floor",
                    "num_ack_pending",
                    "num_redelivered",
                    "num_waiting",
                    "num_pending",
                )
            }
            figures.notes.append(
                f"consume missing {missing[:10]} (delivered "
                f"{[self.delivered[s] for s in missing[:10]]}); consumer {state}"
            )
        return figures

    def _figures(
        self, scenario: str, published: list[dict], watched: list[dict], counters: list[dict]
    ) -> Figures:
        f = Figures(scenario=scenario)
        calls = self.history.calls
        f.requests = len(calls)
        if calls:
            f.seconds = max(c.ended for c in calls) - min(c.started for c in calls)
        # publishes
        stored_ids: dict[str, list[int]] = defaultdict(list)
        for m in published:
            stored_ids[(m["headers"] or {}).get("Nats-Msg-Id", "")].append(m["seq"])
        f.publishes_acked = len(self.acked)
        lost = [(i, s) for i, s in self.acked.items() if s not in stored_ids.get(i, [])]
        f.acked_lost = len(lost)
        dups = {i: s for i, s in stored_ids.items() if len(s) > 1}
        f.duplicate_msg_ids = len(dups)
        f.duplicate_first_acks = len(self.dup_first)
        at_seq = {m["seq"]: (m["headers"] or {}).get("Nats-Msg-Id") for m in published}
        f.examples += [
            f"acked publish lost: {i} acked at seq {s} (tries, duplicate, stream, s after the "
            "fault: "
            f"{self.ack_detail.get(i)}); stored at {stored_ids.get(i, [])}, seq "
            f"{s} holds {at_seq.get(s)!r}; stream has {len(published)} messages up to "
            f"{max(at_seq, default=0)}"
            for i, s in lost[:3]
        ]
        f.examples += [f"Nats-Msg-Id stored twice: {i} at {s}" for i, s in list(dups.items())[:3]]
        # CAS
        answered = {a.id: a for a in self.attempts}
        stored: dict[str, dict] = {}
        by_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # key -> (rev, n, id)
        prefix = f"$KV.{self.counters}."
        for m in counters:
            value = json.loads(m["data"])
            key = m["subject"][len(prefix) :]
            stored[value["w"]] = {"key": key, "rev": m["seq"], "n": value["n"]}
            by_key[key].append((m["seq"], value["n"], value["w"]))
        f.cas_200 = sum(1 for a in self.attempts if a.status in (200, 201))
        f.cas_412 = sum(1 for a in self.attempts if a.status == 412)
        f.cas_unknown = sum(1 for a in self.attempts if a.status in UNKNOWN or a.status == 0)
        f.cas_stored = len(counters)
        lost_cas = [
            a
            for a in self.attempts
            if a.status in (200, 201) and (stored.get(a.id) or {}).get("rev") != a.revision
        ]
        same_n = []
        for key, entries in by_key.items():
            ns = [n for _, n, _ in sorted(entries)]
            if ns != list(range(len(ns))):
                same_n.append((key, ns))
        f.cas_lost = len(lost_cas) + sum(len(ns) - len(set(ns)) for _, ns in same_n)
        f.examples += [
            f"acked CAS not stored at its revision: {a} stored={stored.get(a.id)}"
            for a in lost_cas[:3]
        ]
        f.examples += [f"key {k} history n={ns[:60]}" for k, ns in same_n[:2]]
        refused = [
            answered[w]
            for w in stored
            if w in answered
            and answered[w].status not in (200, 201)
            and answered[w].status not in UNKNOWN
            and answered[w].status != 0
        ]
        f.refused_but_stored = len(refused)
        t0 = self.timeline.fault_at or 0.0
        f.examples += [
            f"stored although answered {a.status} {a.code} ({a.detail}) at "
            f"fault+{a.started - t0:.1f}s..{a.ended - t0:.1f}s: {a.key} n={a.n} rev "
            f"{stored[a.id]['rev']}"
            for a in refused[:4]
        ]
        per_key: dict[str, Counter[str]] = defaultdict(Counter)
        for a in self.attempts:
            per_key[a.key][
                "ok"
                if a.status in (200, 201)
                else "unknown"
                if a.status in UNKNOWN or a.status == 0
                else "refused"
            ] += 1
        for key, entries in by_key.items():
            c = per_key[key]
            f.refused_but_stored_by_count += max(0, len(entries) - c["ok"] - c["unknown"])
        unknown_writes = [w for w in stored if w not in answered]
        if unknown_writes:
            f.notes.append(f"{len(unknown_writes)} stored CAS writes of no recorded attempt")
        # reads
        f.stale_kv_reads = len(self.stale_kv)
        f.stale_kv_max = max(self.stale_kv, default=0)
        f.stale_kv_leader_reads = len(self.stale_kv_leader)
        f.stale_kv_leader_max = max(self.stale_kv_leader, default=0)
        f.stale_replica_max = max(self.stale_replica, default=0)
        f.stale_leader_reads = self.stale_leader
        # watch
        stored_revs = {m["seq"] for m in watched}
        seen = set(self.watch_seen)
        f.watch_events = len(self.watch_seen)
        f.watch_missed = len(stored_revs - seen)
        f.watch_repeated = self.watch_repeated
        f.watch_reconnects = self.watch_reconnects
        if stored_revs - seen:
            f.examples.append(f"watch missed revisions {sorted(stored_revs - seen)[:10]}")
        # consume
        stored_seqs = {m["seq"] for m in published}
        f.consume_missing = len(stored_seqs - self.delivered.keys())
        f.consume_unconfirmed_acks = len(self.delivered.keys() - self.consume_acked)
        f.consume_redelivered = sum(1 for n in self.delivered.values() if n > 1)
        # answers
        t = self.timeline
        plain = [c for c in calls if c.op not in SSE_OPS]
        latencies = [c.ended - c.started for c in plain]
        f.max_latency = max(latencies, default=0.0)
        f.full_timeout_waits = sum(1 for x in latencies if x >= self.request_timeout - 0.1)
        if t.fault_at is not None:
            late = t.fault_at + 10.0
            f.full_timeout_waits_late = sum(
                1
                for c in plain
                if c.ended - c.started >= self.request_timeout - 0.1
                and late <= c.started
                and (t.heal_at is None or c.started < t.heal_at)
            )
        slow = [c for c in plain if c.ended - c.started > self.request_timeout + MARGIN]
        f.slow_answers = len(slow)
        f.examples += [
            f"slow answer: {c.op} {c.status} {c.code} after {c.ended - c.started:.2f}s "
            f"at fault+{c.started - (t.fault_at or 0.0):.1f}s"
            for c in slow[:3]
        ]
        f.unexpected = len(self.unexpected)
        f.unexpected_by_kind = dict(self.unexpected_kinds)
        f.examples = self.unexpected[:4] + f.examples
        f.errors_by_code = dict(
            sorted(
                Counter(
                    f"{c.status} {c.code}" for c in calls if c.status >= 500 or c.status == 0
                ).items()
            )
        )
        if t.heal_at is not None:
            after = [c.ended for c in plain if 200 <= c.status < 300 and c.ended >= t.heal_at]
            f.heal_to_first_success = (min(after) - t.heal_at) if after else None
            failed = [c.ended for c in self.failures_since(t.heal_at)]
            f.heal_to_all_success = max(failed, default=t.heal_at) - t.heal_at
        if t.fault_at is not None:
            end = t.heal_at or max((c.ended for c in plain), default=t.fault_at)
            failed = [c.ended for c in self.failures_since(t.fault_at) if c.started < end]
            last = max(failed, default=t.fault_at)
            ok_after = [c for c in plain if c.started > last and c.ended < end and c.status < 300]
            # steady: the failures stopped at least 2 s before the fault ended
            f.fault_to_steady = last - t.fault_at if (end - last >= 2.0 and ok_after) else None
        f.notes += self.notes[:6]
        return f
