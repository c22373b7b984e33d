"""What the clients of a fault test saw: one record per HTTP request, checked afterwards."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats
import nats.errors
import nats.js.errors

# Statuses a client may see while a node or the whole server is down. Anything else (a 500, a
# 404 "no stream" for a stream that exists, ...) is a bug.
ALLOWED_DURING_FAULTS = {200, 201, 503, 504}


@dataclass
class Call:
    op: str
    status: int
    code: str | None
    started: float
    ended: float
    retry_after: str | None = None
    detail: str | None = None


@dataclass
class History:
    calls: list[Call] = field(default_factory=list)

    def record(self, op: str, started: float, response: httpx.Response) -> Call:
        code = detail = None
        if response.headers.get("content-type", "").startswith("application/problem+json"):
            body = response.json()
            code, detail = body.get("code"), body.get("detail")
        call = Call(
            op,
            response.status_code,
            code,
            started,
            time.monotonic(),
            response.headers.get("retry-after"),
            detail,
        )
        self.calls.append(call)
        return call

    def counts(self) -> Counter[tuple[str, int, str | None]]:
        return Counter((c.op, c.status, c.code) for c in self.calls)

    def unexpected(self, allowed: set[int] = ALLOWED_DURING_FAULTS) -> list[Call]:
        return [c for c in self.calls if c.status not in allowed]

    def summary(self) -> str:
        rows = sorted(self.counts().items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or ""))
        return "\n".join(
            f"  {op:<12} {status} {code or '':<28} {n}" for (op, status, code), n in rows
        )


async def stored_messages(urls: list[str], stream: str) -> list[dict[str, Any]]:
    """Every message of the stream, read with nats-py from the stream leader, seq order."""
    nc = await nats.connect(urls, connect_timeout=2)
    try:
        deadline = time.monotonic() + 20
        while True:  # (an answer with an error and no state while the cluster elects)
            info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", timeout=5)).data)
            if "state" in info or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        state = info["state"]
        first, last = state["first_seq"], state["last_seq"]
        js = nc.jetstream(timeout=5)

        async def one(seq: int) -> dict[str, Any] | None:
            # Right after a kill the cluster may still be electing (10008, "JetStream system
            # temporarily unavailable"): the check asks again, for up to 20 s.
            deadline = time.monotonic() + 20
            while True:
                try:
                    msg = await js.get_msg(stream, seq)
                    break
                except nats.js.errors.NotFoundError:
                    return None
                except nats.js.errors.ServiceUnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.25)
            return {
                "seq": msg.seq,
                "subject": msg.subject,
                "data": msg.data,
                "headers": dict(msg.headers or {}),
            }

        out: list[dict[str, Any]] = []
        for chunk in range(first, last + 1, 200):
            got = await asyncio.gather(*(one(s) for s in range(chunk, min(chunk + 200, last + 1))))
            out.extend(m for m in got if m is not None)
        assert len(out) == state["messages"], (len(out), state)
        return out
    finally:
        await nc.close()
