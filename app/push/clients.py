"""The HTTP clients a process delivers with: httpx, in shards of :data:`SHARD` POSTs.

httpcore's connection pool assigns each request to a connection by scanning every queued
request against every connection, so its cost per request grows with the square of the
requests in flight: with 400 POSTs out at once on one client, that scan took half of the
process's time and held its event loop for seconds at a time. So a POST takes the lowest
free slot of the process's ``concurrency`` (all subscriptions together), and slot ``n``
uses client ``n // SHARD``: no client ever has more than :data:`SHARD` requests in flight,
and the low slots, taken first, keep their connections warm.

Every client follows no redirect (a 3xx is an answer: the endpoint was checked, not where it
points) and ignores the environment's proxy settings (the endpoints are the pod's own).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

SHARD = 64


class HttpClients:
    def __init__(self) -> None:
        self._clients: list[httpx.AsyncClient] = []
        self._free: list[int] = []
        self._next = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[httpx.AsyncClient]:
        """A client for one POST, with a place among its :data:`SHARD` for the POST's time."""
        slot = heapq.heappop(self._free) if self._free else self._take_next()
        try:
            index = slot // SHARD
            while len(self._clients) <= index:
                self._clients.append(_client())
            yield self._clients[index]
        finally:
            heapq.heappush(self._free, slot)

    def _take_next(self) -> int:
        slot, self._next = self._next, self._next + 1
        return slot

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        timeout=None,  # each request says its own: the subscription's timeout
        limits=httpx.Limits(max_connections=SHARD, max_keepalive_connections=SHARD),
    )
