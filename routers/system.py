"""Probes, metrics and gateway information."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from app import __version__, errors
from app.auth.access import AUTHENTICATED, PUBLIC, sees_account
from app.deps import PrincipalDep, RuntimeDep
from app.errors import ErrorCode
from app.http import JSON, problems
from app.nats import features
from app.routing import Router

router = Router(tags=["system"])


@router.get("/healthz", access=PUBLIC, response_class=JSON)
async def healthz() -> dict[str, str]:
    """Liveness: 200 while the process runs (does not depend on NATS)."""
    return {"status": "ok"}


@router.get("/readyz", access=PUBLIC, response_class=JSON, responses=problems())
async def readyz(runtime: RuntimeDep) -> dict[str, Any]:
    """Readiness: 200 when a pooled connection is up and JetStream answers."""
    pool = runtime.pool
    if not pool.connected:
        raise errors.Unavailable(
            ErrorCode.NATS_UNAVAILABLE,
            "no pooled NATS connection is up",
            headers={"Retry-After": str(runtime.settings.retry_after)},
        )
    await runtime.js.call("info", "INFO", timeout=min(2.0, runtime.settings.request_timeout))
    return {"status": "ready", "connections": pool.connected}


@router.get("/metrics", access=PUBLIC, response_class=Response)
async def metrics(runtime: RuntimeDep) -> Response:
    """Prometheus text exposition."""
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/info", access=AUTHENTICATED, response_class=JSON, responses=problems())
async def info(runtime: RuntimeDep, principal: PrincipalDep) -> dict[str, Any]:
    """Gateway and nats-server versions, what the server lacks, JetStream account, pool.

    Any token learns the versions, the server's name, cluster and max_payload, what it lacks
    and the JetStream domain. The account's figures (`jetstream`: streams, consumers,
    storage, limits, API counters) and the gateway's connections (`pool`) cover every stream:
    they are null unless the token may read every stream (or auth is off).
    """
    server = runtime.pool.server_info()
    whole = sees_account(principal)
    account: dict[str, Any] | None = None
    if whole:
        try:
            account = await runtime.js.call("account.info", "INFO")
            account.pop("type", None)
        except (errors.Unavailable, errors.Timeout):
            account = None
    return {
        "version": __version__,
        "server": {
            "version": server.get("version"),
            "name": server.get("server_name"),
            "cluster": server.get("cluster"),
            "max_payload": server.get("max_payload"),
            "jetstream": server.get("jetstream"),
            # What this release lacks of what the gateway can use (answered 501 when asked).
            "missing_features": features.missing(server.get("version")),
        },
        "jetstream": account,
        "js_domain": runtime.settings.js_domain,
        "embedded": runtime.embedded is not None,
        "pool": {
            "size": runtime.settings.pool_size,
            "connected": runtime.pool.connected,
            "connections": runtime.pool.state(),
        }
        if whole
        else None,
    }
