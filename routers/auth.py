"""Short-lived tokens for browsers, whose EventSource cannot send an Authorization header."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from app import errors
from app.auth.access import AUTHENTICATED
from app.auth.guard import SSE_COOKIE
from app.deps import PrincipalDep, RuntimeDep
from app.durations import format_time
from app.http import JSON, problems
from app.routing import Router

router = Router(prefix="/v1/auth", tags=["auth"])


class SseToken(BaseModel):
    token: str
    expires_at: str
    ttl: float


@router.post(
    "/sse-token",
    access=AUTHENTICATED,
    response_model=SseToken,
    response_class=JSON,
    responses=problems(errors.Unauthorized),
)
async def sse_token(
    principal: PrincipalDep, runtime: RuntimeDep, request: Request, response: Response
) -> Any:
    """Mint a short-lived token for SSE feeds (`?access_token=` or the `jsgw_sse` cookie).

    It is accepted only by the SSE endpoints, carries the caller's grants, and expires after
    `JSGW_SSE_TOKEN_TTL` seconds; the long-lived bearer token never goes into a URL. Over
    HTTPS the cookie is `Secure`.
    """
    from datetime import UTC, datetime

    ttl = runtime.settings.sse_token_ttl
    token, expires = runtime.auth.mint_sse_token(principal, ttl)
    # Secure when this request came over TLS (the gateway's own: forwarded headers are not
    # trusted, so behind a TLS-terminating proxy the proxy adds it, docs/security.md).
    response.set_cookie(
        SSE_COOKIE,
        token,
        max_age=int(ttl),
        httponly=True,
        samesite="strict",
        path="/v1",
        secure=request.url.scheme == "https",
    )
    return {
        "token": token,
        "expires_at": format_time(datetime.fromtimestamp(expires, UTC)),
        "ttl": ttl,
    }
