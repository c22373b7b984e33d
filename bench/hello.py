"""A FastAPI "hello" route, the framework's own cost on this stack (no middleware, no NATS).

``GET /hello`` answers ``{"hello": "world"}``; ``PUT /hello`` reads the body and answers
``{"revision": 1}``. Run: ``uvicorn bench.hello:app --loop uvloop --http httptools``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

app = FastAPI()


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


@app.put("/hello")
async def put_hello(request: Request) -> dict[str, int]:
    await request.body()
    return {"revision": 1}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
