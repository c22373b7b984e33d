"""A pool of NATS connections, each reconnecting on its own and replaced if it gives up.

Requests go round-robin over the connections that are up; with none up they fail at once
(503) rather than queueing. Nothing is ever buffered while a connection is down
(``pending_size=0``), and whatever was still unsent when a connection dropped is discarded,
so a request the gateway already answered as failed or unknown is never sent later.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client

from app import compat
from app.config import Settings
from app.errors import (
    ErrorCode,
    GatewayError,
    NoResponders,
    OutcomeUnknown,
    PayloadTooLarge,
    StreamUnavailable,
    Timeout,
    Unavailable,
)
from app.metrics import Metrics
from app.nats import features
from app.nats.replies import (
    ConnectionLost,
    LeanClient,
    RawHandler,
    RawInbox,
    RawSubscription,
    Reply,
    Settled,
)
from app.tasks import cancel_and_wait

log = logging.getLogger("jsgw.pool")

T = TypeVar("T")

# When the answer that the running NATS calls belong to must be given (time.monotonic()):
# set by NatsPool.within for the later steps of one answer, and none of them waits past it.
_ANSWER_DUE: ContextVar[float | None] = ContextVar("jsgw_answer_due", default=None)

# A write that met no responders although its stream is there (its leader is being elected,
# or moved, or the stream is new, and the leader's subscription has not reached every server
# yet) is sent again this often, this many seconds apart, while its answer's time allows
# (nats.go's JetStream publish does the same: two retries, 250 ms apart).
_UNTAKEN_RETRIES = 2
_UNTAKEN_RETRY_WAIT = 0.25

_NOT_CONNECTED = (
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
)
# What a NATS call may raise that the pool turns into a domain error (see NatsPool._mapped).
_MAPPED = (
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.errors.MaxPayloadError,
    *_NOT_CONNECTED,
)


@dataclass
class _Slot:
    index: int
    client: Client | None = None
    task: asyncio.Task[None] | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    connected_since: float | None = None
    reconnects: int = 0
    replaced: int = 0
    last_error: str | None = None
    server: str | None = None  # host:port of the server it is (or was last) connected to
    probe: asyncio.Task[None] | None = None  # a liveness check in progress (out of rotation)
    trying: str | None = None  # the server a reconnect is trying now

    @property
    def up(self) -> bool:
        return self.client is not None and self.client.is_connected


class NatsPool:
    def __init__(self, settings: Settings, servers: list[str], metrics: Metrics) -> None:
        self._settings = settings
        self._servers = servers
        self._metrics = metrics
        self._slots = [_Slot(i) for i in range(settings.pool_size)]
        self._next = 0
        self._closing = False
        self._any_up = asyncio.Event()
        self.timeout = settings.request_timeout
        metrics.pool_size.set(settings.pool_size)
        metrics.gauge_function(metrics.pool_connections_up, lambda: self.connected)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, wait: float | None = None) -> None:
        """Start every slot; wait up to ``wait`` seconds for the first connection."""
        for slot in self._slots:
            slot.task = asyncio.create_task(self._supervise(slot), name=f"nats-pool-{slot.index}")
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._any_up.wait(), wait)

    async def close(self, timeout: float = 5.0) -> None:
        """Drain every connection, then stop the supervisors. Idempotent."""
        if self._closing:
            return
        self._closing = True
        errors: list[BaseException] = []
        for slot in self._slots:
            client = slot.client
            if client is None or client.is_closed:
                continue
            try:
                if client.is_connected:
                    await asyncio.wait_for(client.drain(), timeout)
                else:
                    await client.close()
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                errors.append(exc)
                await client.close()
        for slot in self._slots:
            if slot.probe is not None:
                slot.probe.cancel()
            await cancel_and_wait(slot.task)
        for error in errors:
            log.warning("error while draining a NATS connection: %r", error)

    async def _supervise(self, slot: _Slot) -> None:
        """Keep one connection alive: connect, wait for it to close for good, replace it."""
        backoff = self._settings.reconnect_wait
        while not self._closing:
            slot.closed.clear()
            client = LeanClient()
            client.replies.on_extra_reply = self._extra_reply
            client.replies.on_timeout = functools.partial(self._suspect, slot, client)
            try:
                await client.connect(**self._connect_options(slot))
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                slot.last_error = repr(exc)
                log.warning("NATS connection %d: connect failed: %r", slot.index, exc)
                with contextlib.suppress(nats.errors.Error, OSError):
                    await client.close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = self._settings.reconnect_wait
            slot.client = client
            slot.server = _netloc(client)
            slot.connected_since = time.time()
            slot.last_error = None
            self._any_up.set()
            self._metrics.refresh()  # (computed gauges, with several workers)
            await slot.closed.wait()
            if not self._closing:
                slot.replaced += 1
                self._metrics.nats_replaced.inc()
                log.warning("NATS connection %d was closed by the client; replacing it", slot.index)

    def _extra_reply(self, kind: str) -> None:
        self._metrics.nats_extra_replies.labels(kind).inc()

    def _connect_options(self, slot: _Slot) -> dict[str, Any]:
        s = self._settings

        async def disconnected() -> None:
            client = slot.client
            if client is not None:
                # Unsent commands of a dead connection belong to requests that have been (or
                # will be) answered as failed: never replay them on the next connection.
                compat.discard_unsent(client)
                # No reply can come any more: the requests waiting for one end now.
                if isinstance(client, LeanClient):
                    client.replies.fail_pending()
            self._metrics.refresh()
            if not self._closing:
                log.warning("NATS connection %d disconnected from %s", slot.index, slot.server)

        async def reconnected() -> None:
            slot.reconnects += 1
            if slot.client is not None:
                slot.server = _netloc(slot.client)
            slot.connected_since = time.time()
            self._metrics.nats_reconnects.inc()
            self._metrics.refresh()
            log.info("NATS connection %d reconnected", slot.index)

        async def closed() -> None:
            slot.closed.set()
            self._metrics.refresh()

        async def error(exc: Exception) -> None:
            slot.last_error = repr(exc)
            log.debug("NATS connection %d: %r", slot.index, exc)

        options: dict[str, Any] = {
            "servers": self._servers,
            "name": f"jsgw-{slot.index}",
            "allow_reconnect": True,
            "max_reconnect_attempts": s.max_reconnect_attempts,
            "reconnect_time_wait": s.reconnect_wait,
            "connect_timeout": min(2.0, s.request_timeout),
            # A server that stops answering (a cut link: no RST, no FIN) is noticed after
            # this many unanswered pings, instead of nats-py's 2 x 120 s.
            "ping_interval": s.nats_ping_interval,
            "max_outstanding_pings": s.nats_max_outstanding_pings,
            "reconnect_to_server_handler": self._reconnect_choice(slot),
            "pending_size": 0,
            "disconnected_cb": disconnected,
            "reconnected_cb": reconnected,
            "closed_cb": closed,
            "error_cb": error,
        }
        options.update(_auth_options(s))
        tls = _tls_context(s)
        if tls is not None:
            options["tls"] = tls
        return options

    def _reconnect_choice(
        self, slot: _Slot
    ) -> Callable[[list[Any], dict[str, Any]], tuple[Any, float]]:
        """Which server a reconnecting connection tries next: one that another connection of
        the pool is on now (known reachable), else one other than the server it lost, else
        one no other reconnecting connection is trying, else the one tried longest ago; the
        same server is tried again only after ``reconnect_wait``."""
        tried: dict[str, float] = {}

        def choose(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
            others = [other for other in self._slots if other is not slot]
            live = {other.server for other in others if other.up}
            # Servers other connections are trying now: spread out, one may be unreachable.
            trying = {other.trying for other in others if not other.up}
            chosen = min(
                servers,
                key=lambda server: (
                    server.uri.netloc not in live,
                    server.uri.netloc == slot.server,
                    server.uri.netloc in trying,
                    tried.get(server.uri.netloc, 0.0),
                ),
            )
            slot.trying = chosen.uri.netloc
            now = time.monotonic()
            last = tried.get(chosen.uri.netloc)
            delay = 0.0 if last is None else max(0.0, self._settings.reconnect_wait - (now - last))
            tried[chosen.uri.netloc] = now + delay
            return chosen, delay

        return choose

    def _suspect(self, slot: _Slot, client: Client) -> None:
        """Requests on this connection timed out: ping it at once, out of rotation meanwhile.

        A server that does not answer the ping within a second is taken as gone (a cut link
        sends no RST): the connection reconnects, to another server when its own is
        unreachable, without waiting for the regular pings to notice.
        """
        if self._closing or slot.client is not client:
            return
        # The other connections to that server are likely cut off as well: checked together.
        for other in self._slots:
            peer = other.client
            if (
                (other is slot or other.server == slot.server)
                and other.probe is None
                and (peer is not None and peer.is_connected)
            ):
                other.probe = asyncio.create_task(
                    self._probe(other, peer), name=f"nats-probe-{other.index}"
                )

    async def _probe(self, slot: _Slot, client: Client) -> None:
        try:
            try:
                # nats-py annotates the timeout as int; it is asyncio.wait_for's, in seconds.
                timeout: Any = self._settings.nats_probe_timeout
                await client.flush(timeout=timeout)
                return
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                failure = exc
            if slot.client is client and client.is_connected and not self._closing:
                self._metrics.nats_probes_failed.inc()
                log.warning(
                    "NATS connection %d: %s did not answer a ping (%r) after requests timed "
                    "out; reconnecting",
                    slot.index,
                    slot.server,
                    failure,
                )
                await compat.force_reconnect(client, nats.errors.StaleConnectionError())
        finally:
            slot.probe = None

    # -- use -------------------------------------------------------------------------------

    def pick(self) -> Client:
        """A connected client, round-robin, leaving out those whose liveness is being checked
        while another is up; 503 at once when none is connected."""
        count = len(self._slots)
        for offset in range(count):
            slot = self._slots[(self._next + offset) % count]
            if slot.probe is None and slot.up:
                self._next = (slot.index + 1) % count
                assert slot.client is not None
                return slot.client
        for slot in self._slots:  # only connections being checked: better than none
            if slot.up:
                assert slot.client is not None
                return slot.client
        raise Unavailable(
            ErrorCode.NATS_UNAVAILABLE,
            "no NATS connection is up; retry shortly",
            headers={"Retry-After": str(self._settings.retry_after)},
        )

    async def raw_inbox(self, handler: RawHandler) -> RawInbox:
        """An inbox of its own on a connection that is up, its replies handed to ``handler``
        raw (``RawInbox``); 503 at once when none is."""
        client = self.pick()
        assert isinstance(client, LeanClient)
        return await client.raw_inbox(handler)

    async def confirm(self, client: Client, operation: str) -> None:
        """Until the server has processed what ``client`` has sent and queued (a SUB just
        made): :meth:`LeanClient.flush_in_order`, with the pool's timeout and error mapping."""
        assert isinstance(client, LeanClient)
        await self.observe(operation, lambda: client.flush_in_order(self.wait(operation=operation)))

    async def raw_subscription(
        self, subject: str, handler: RawHandler, *, queue: str = "", operation: str
    ) -> RawSubscription:
        """A subscription on a connection that is up, its messages handed to ``handler`` raw,
        flushed: the server has it when this returns. 503 at once when no connection is up."""
        client = self.pick()
        assert isinstance(client, LeanClient)

        async def subscribed() -> RawSubscription:
            sub = await client.raw_subscribe(subject, handler, queue)
            opened = RawSubscription(client, sub)
            try:
                await client.flush_in_order(self.wait(operation=operation))
            except BaseException:
                await opened.close()
                raise
            return opened

        opened: RawSubscription = await self.observe(operation, subscribed)
        return opened

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        operation: str,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        write: bool = False,
        client: Client | None = None,
        stored: Settled | None = None,
        resend: bool = False,
    ) -> Reply:
        """Request/reply on a pooled connection, with every NATS failure mapped to a domain error.

        Answered through the connection's reply mux (app.nats.replies): the reply's raw header
        block parsed once. ``client`` pins the request to one connection (to keep a sequence
        of writes in order). ``stored``: the request is a write whose refusals are confirmed
        before they are believed (``ReplyMux.request_write``; ``resend`` when it carries a
        ``Nats-Msg-Id``).
        """
        lean = client or self.pick()
        assert isinstance(lean, LeanClient)
        # (Nothing is sent, nor timed, when no time is left.)
        wait = self.wait(timeout, operation=operation)
        # observe(), inlined: the hottest call of the gateway, one coroutine fewer.
        started = time.perf_counter()
        try:
            if stored is not None:
                return await lean.replies.request_write(
                    subject,
                    payload,
                    wait,
                    headers,
                    stored,
                    grace=self._settings.write_confirm_grace,
                    resend=resend,
                )
            return await lean.replies.request(subject, payload, wait, headers)
        except _MAPPED as exc:
            if not (isinstance(exc, ConnectionLost) and not write and client is None):
                raise self._mapped(exc, operation, write) from None
        finally:
            self._metrics.observe_nats(operation, time.perf_counter() - started)
        # A read whose connection broke while it waited: asked once more, on one that is up,
        # in what is left of its time.
        with self.within(time.monotonic() - (time.perf_counter() - started), timeout):
            return await self.request(
                subject,
                payload,
                operation=operation,
                headers=headers,
                timeout=timeout,
                client=self.pick(),
            )

    async def sent_again(
        self,
        send: Callable[[], Awaitable[T]],
        refused: Callable[[], Awaitable[GatewayError]],
        started: float,
        timeout: float | None = None,
    ) -> T:
        """A write that nobody took (``send`` raised NoResponders), sent again by ``send``.

        Only a stream's leader listens on its subjects: right after a stepdown, or the
        stream's creation, the new leader's subscription has not reached every server yet and
        a write meets no responders. Nothing is stored when nobody takes a message, so sending
        it again cannot store it twice. ``refused`` says why nobody took it: a 503
        ``stream.unavailable`` (a stream is there) is sent again as :meth:`untaken_pauses`
        paces it, in what is left of the write's time since ``started`` (time.monotonic());
        anything else (a 404: no stream), or the last refusal, is raised. Only for a write
        with none of its sequence sent behind it: a copy sent again lands after those.
        """
        with self.within(started, timeout):
            problem = await refused()
            if isinstance(problem, StreamUnavailable):
                for pause in self.untaken_pauses():
                    await asyncio.sleep(pause)
                    try:
                        return await send()
                    except NoResponders:
                        pass
                    except Timeout as exc:
                        if isinstance(exc, OutcomeUnknown):  # sent, and not answered in time
                            raise
                        break  # no time left to send it: nothing was sent
            raise problem

    def untaken_pauses(self) -> Iterator[float]:
        """The pauses (seconds) to wait before sending again what nobody took (a leader just
        elected or moved, its subscription not yet on the gateway's server): two, 250 ms
        each, as nats.go's JetStream publish does, each only while what is left of the
        answer's time (:meth:`within`) holds it and one more attempt. (A plain generator:
        a loop that leaves it early leaves nothing to finalise.)"""
        for _ in range(_UNTAKEN_RETRIES):
            try:
                if self.wait() <= 2 * _UNTAKEN_RETRY_WAIT:
                    return
            except Timeout:
                return
            yield _UNTAKEN_RETRY_WAIT

    async def request_batch(
        self,
        messages: list[tuple[str, dict[str, str], bytes]],
        *,
        operation: str,
        timeout: float | None = None,
    ) -> list[Reply | None]:
        """Requests (subject, headers, payload) queued on one connection together, all or
        none (``ReplyMux.request_batch``), for a write made of several messages: the reply of
        each (None: not come by the time the last one's did). A timeout or a broken
        connection waiting for the last reply is 504 ``nats.outcome_unknown``; no connection
        up, 503 with nothing sent."""
        client = self.pick()
        assert isinstance(client, LeanClient)
        replies: list[Reply | None] = await self.observe(
            operation,
            lambda: client.replies.request_batch(messages, self.wait(timeout, operation=operation)),
            write=True,
        )
        return replies

    async def requests(
        self,
        requests: list[tuple[str, bytes]],
        *,
        operation: str,
        timeout: float | None = None,
    ) -> list[Reply | Exception]:
        """Many requests on one connection, sent together with one deadline (acks of a
        batch): a reply each, or nats-py's NoRespondersError / TimeoutError for that one."""
        client = self.pick()
        assert isinstance(client, LeanClient)
        results: list[Reply | Exception] = await self.observe(
            operation,
            lambda: client.replies.request_all(requests, self.wait(timeout, operation=operation)),
        )
        for result in results:
            if isinstance(result, nats.errors.NoRespondersError):
                self._metrics.nats_errors.labels(operation, "no_responders").inc()
            elif isinstance(result, nats.errors.TimeoutError):
                self._metrics.nats_errors.labels(operation, "timeout").inc()
        return results

    def wait(self, timeout: float | None = None, *, operation: str | None = None) -> float:
        """How long a NATS call may wait for its answer: ``timeout`` (the request timeout
        when None), cut to what is left of the answer it belongs to (:meth:`within`); 504
        ``nats.timeout`` when nothing is left, and nothing is sent. The refusal is counted
        as a timeout of ``operation`` in ``jsgw_nats_request_errors_total`` (none: not
        counted)."""
        wait = timeout or self.timeout
        due = _ANSWER_DUE.get()
        if due is not None:
            wait = min(wait, due - time.monotonic())
            if wait <= 0:
                if operation is not None:
                    self._metrics.nats_errors.labels(operation, "timeout").inc()
                raise Timeout(ErrorCode.NATS_TIMEOUT, "NATS did not answer in time")
        return wait

    @contextlib.contextmanager
    def within(self, started: float, timeout: float | None = None) -> Iterator[None]:
        """The NATS calls made in this block end within ``timeout`` (the request timeout
        when None) of ``started`` (time.monotonic()), as one call begun then would.

        For the later steps of one answer: a read asked again of the stream leader after a
        replica answered behind, or again on another connection after its own broke. Each
        step alone keeps to the request timeout; without this, their sum did not, and an
        answer could come after twice the time a client was told it waits.
        """
        due = started + (timeout or self.timeout)
        outer = _ANSWER_DUE.get()
        token = _ANSWER_DUE.set(due if outer is None else min(due, outer))
        try:
            yield
        finally:
            _ANSWER_DUE.reset(token)

    async def observe(
        self, operation: str, call: Callable[[], Awaitable[Any]], *, write: bool = False
    ) -> Any:
        """Run one NATS call with latency metrics and error mapping."""
        started = time.perf_counter()
        try:
            return await call()
        except _MAPPED as exc:
            raise self._mapped(exc, operation, write) from None
        finally:
            self._metrics.observe_nats(operation, time.perf_counter() - started)

    def _mapped(self, exc: BaseException, operation: str, write: bool) -> Exception:
        """The domain error for a failed NATS call (one of ``_MAPPED``), counted."""
        if isinstance(exc, nats.errors.NoRespondersError):
            self._metrics.nats_errors.labels(operation, "no_responders").inc()
            return NoResponders(ErrorCode.NATS_NO_RESPONDERS, "no responders on the subject")
        if isinstance(exc, nats.errors.TimeoutError):
            self._metrics.nats_errors.labels(operation, "timeout").inc()
            if write:
                return OutcomeUnknown(
                    detail="NATS did not confirm the write in time: it may or may not be "
                    "stored. Retry with the same Nats-Msg-Id to stay idempotent."
                )
            return Timeout(ErrorCode.NATS_TIMEOUT, "NATS did not answer in time")
        if isinstance(exc, nats.errors.MaxPayloadError):
            return PayloadTooLarge(
                ErrorCode.REQUEST_TOO_LARGE, "the message is larger than the server's max_payload"
            )
        return self._down(operation, "the NATS connection is down; nothing was sent")

    def _down(self, operation: str, detail: str) -> Unavailable:
        self._metrics.nats_errors.labels(operation, "unavailable").inc()
        return Unavailable(
            ErrorCode.NATS_UNAVAILABLE,
            f"{detail}. Retry shortly.",
            headers={"Retry-After": str(self._settings.retry_after)},
        )

    # -- state -----------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def connected(self) -> int:
        return sum(slot.up for slot in self._slots)

    @property
    def max_payload(self) -> int:
        for slot in self._slots:
            if slot.up and slot.client is not None:
                return slot.client.max_payload
        return 1024 * 1024

    def require(self, *wanted: features.Feature) -> None:
        """501 ``nats.feature_unsupported`` when the connected server predates one of these."""
        version = self.server_info().get("version")
        for feature in wanted:
            features.require(version, feature)

    def offers(self, feature: features.Feature) -> bool:
        """Does the connected server offer ``feature`` (an unknown version: as if it did)?"""
        have = features.release(self.server_info().get("version"))
        return have is None or have >= feature.since

    def server_info(self) -> dict[str, Any]:
        for slot in self._slots:
            if slot.up and slot.client is not None:
                return compat.server_info(slot.client)
        return {}

    def state(self) -> list[dict[str, Any]]:
        out = []
        for slot in self._slots:
            client = slot.client
            out.append(
                {
                    "index": slot.index,
                    "connected": slot.up,
                    "server": _netloc(client) if slot.up and client else None,
                    "reconnects": slot.reconnects,
                    "replaced": slot.replaced,
                    "last_error": slot.last_error,
                }
            )
        return out


def _netloc(client: Client) -> str | None:
    url = client.connected_url
    return url.netloc if url is not None else None


def _auth_options(s: Settings) -> dict[str, Any]:
    if s.nats_creds is not None:
        return {"user_credentials": str(s.nats_creds)}
    if s.nats_nkey is not None:
        seed = s.nats_nkey.get_secret_value().strip()
        if Path(seed).is_file():
            return {"nkeys_seed": seed}
        return {"nkeys_seed_str": seed}
    if s.nats_user is not None and s.nats_password is not None:
        return {"user": s.nats_user, "password": s.nats_password.get_secret_value()}
    if s.nats_token is not None:
        return {"token": s.nats_token.get_secret_value()}
    return {}


def _tls_context(s: Settings) -> ssl.SSLContext | None:
    wants_tls = (
        s.nats_tls_ca
        or s.nats_tls_cert
        or any(url.startswith(("tls://", "wss://")) for url in s.nats_url)
    )
    if not wants_tls:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(s.nats_tls_ca) if s.nats_tls_ca else None
    )
    if s.nats_tls_cert and s.nats_tls_key:
        context.load_cert_chain(str(s.nats_tls_cert), str(s.nats_tls_key))
    return context
