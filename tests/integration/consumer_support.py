"""Helpers for the pull consumer tests: a stream with a consumer, publishing, pulls, acks."""

from __future__ import annotations

import httpx


async def setup(
    gw: httpx.AsyncClient,
    stream: str,
    consumer: str = "C",
    *,
    stream_config: dict | None = None,
    **config: object,
) -> str:
    """A stream capturing ``<stream lower>.>`` and a consumer on it; returns the subject prefix."""
    prefix = stream.lower()
    body = {"subjects": [f"{prefix}.>"], **(stream_config or {})}
    created = await gw.put(f"/v1/streams/{stream}", json=body)
    assert created.status_code == 201, created.text
    response = await gw.put(f"/v1/streams/{stream}/consumers/{consumer}", json=config)
    assert response.status_code == 201, response.text
    return prefix


async def publish(gw: httpx.AsyncClient, prefix: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        response = await gw.post(f"/v1/publish/{prefix}.{i}", content=f"m{i}".encode())
        assert response.status_code == 200, response.text


async def fetch(
    gw: httpx.AsyncClient, stream: str, consumer: str = "C", pin: str | None = None, **body: object
) -> httpx.Response:
    headers = {"Nats-Pin-Id": pin} if pin else {}
    return await gw.post(
        f"/v1/streams/{stream}/consumers/{consumer}/fetch", json=body, headers=headers
    )


async def ack(
    gw: httpx.AsyncClient, stream: str, items: list[dict], consumer: str = "C"
) -> httpx.Response:
    return await gw.post(f"/v1/streams/{stream}/consumers/{consumer}/ack", json={"acks": items})


async def info(gw: httpx.AsyncClient, stream: str, consumer: str = "C") -> dict:
    response = await gw.get(f"/v1/streams/{stream}/consumers/{consumer}")
    assert response.status_code == 200, response.text
    return response.json()
