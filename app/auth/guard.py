"""Authentication of requests: bearer tokens, short-lived SSE tokens, and rate limits."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from app import b64url, errors
from app.auth.policy import ANONYMOUS, Policy, PolicyError, Principal, load
from app.errors import ErrorCode

log = logging.getLogger("jsgw.auth")

SSE_COOKIE = "jsgw_sse"
SSE_QUERY = "access_token"
_RELOAD_CHECK_EVERY = 1.0


def _unauthorized(detail: str) -> errors.Unauthorized:
    return errors.Unauthorized(
        ErrorCode.AUTH_REQUIRED, detail, headers={"WWW-Authenticate": 'Bearer realm="jsgw"'}
    )


@dataclass
class TokenBucket:
    rate: float
    burst: float
    tokens: float
    stamp: float = field(default_factory=time.monotonic)

    def take(self) -> float:
        """0 when a request may go now, else the seconds until one may."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Authenticator:
    """Knows the tokens (reloading the auth file when it changes) and who a request is."""

    def __init__(
        self, path: Path | None, secret: bytes, *, rate: float = 0.0, burst: int = 0
    ) -> None:
        self.path = path
        self.policy: Policy | None = load(path) if path else None
        self._mtime = path.stat().st_mtime_ns if path else 0
        self._checked = time.monotonic()
        self._sse_key = hmac.new(secret, b"jsgw sse token v1", hashlib.sha256).digest()
        self._rate, self._burst = rate, float(burst or max(1, int(rate)))
        self._buckets: dict[str, TokenBucket] = {}

    @property
    def enabled(self) -> bool:
        return self.policy is not None

    # -- the auth file ---------------------------------------------------------------------

    def reload(self) -> bool:
        """Load the auth file again; on an invalid file keep the tokens in force."""
        if self.path is None:
            return False
        try:
            self.policy = load(self.path)
            self._mtime = self.path.stat().st_mtime_ns
        except (PolicyError, OSError) as exc:
            log.error("auth file not reloaded, keeping the previous tokens: %s", exc)
            return False
        log.info("auth file reloaded: %d principals", len(self.policy.principals))
        return True

    def _reload_if_changed(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._checked < _RELOAD_CHECK_EVERY:
            return
        self._checked = now
        try:
            changed = self.path.stat().st_mtime_ns != self._mtime
        except OSError:
            return
        if changed:
            self.reload()

    # -- requests --------------------------------------------------------------------------

    def authenticate(
        self,
        authorization: str | None,
        sse_token: str | None = None,
        client_cert: str | None = None,
    ) -> Principal:
        """The principal of a request, or 401. ``sse_token`` is only offered on SSE routes;
        ``client_cert`` is the subject of a client certificate the TLS layer verified."""
        if self.policy is None:
            return ANONYMOUS
        self._reload_if_changed()
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _unauthorized("use 'Authorization: Bearer <token>'")
            principal = self.policy.authenticate(token.strip())
            if principal is None:
                raise _unauthorized("unknown token")
            return principal
        if sse_token:
            return self._verify_sse_token(sse_token)
        if client_cert:
            principal = self.policy.by_cert.get(client_cert)
            if principal is None:
                raise _unauthorized("no grants for this client certificate")
            return principal
        raise _unauthorized("authentication required: 'Authorization: Bearer <token>'")

    def limit(self, principal: Principal) -> None:
        """Per-token token bucket; 429 with Retry-After when it is empty."""
        if self._rate <= 0:
            return
        bucket = self._buckets.get(principal.name)
        if bucket is None:
            bucket = self._buckets[principal.name] = TokenBucket(
                self._rate, self._burst, self._burst
            )
        wait = bucket.take()
        if wait > 0:
            raise errors.TooManyRequests(
                ErrorCode.RATE_LIMITED,
                "too many requests for this token",
                headers={"Retry-After": str(max(1, round(wait + 0.5)))},
            )

    # -- short-lived tokens for EventSource, which cannot send headers ---------------------

    def mint_sse_token(self, principal: Principal, ttl: float) -> tuple[str, float]:
        expires = time.time() + ttl
        body = orjson.dumps({"n": principal.name, "e": round(expires, 3)})
        mac = hmac.new(self._sse_key, body, hashlib.sha256).digest()
        token = _b64(body) + "." + _b64(mac)
        return token, expires

    def _verify_sse_token(self, token: str) -> Principal:
        assert self.policy is not None
        try:
            body_part, mac_part = token.split(".", 1)
            body, mac = _unb64(body_part), _unb64(mac_part)
        except ValueError:
            raise _unauthorized("malformed SSE token") from None
        expected = hmac.new(self._sse_key, body, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            raise _unauthorized("invalid SSE token")
        claims = orjson.loads(body)
        if float(claims.get("e", 0)) < time.time():
            raise _unauthorized("SSE token expired: mint a new one")
        for principal in self.policy.principals:
            if principal.name == claims.get("n"):
                return principal
        raise _unauthorized("the SSE token's owner no longer exists")


def _b64(raw: bytes) -> str:
    return b64url.encode(raw)


def _unb64(text: str) -> bytes:
    """Strict: one spelling per token (app/b64url.py)."""
    if not text or len(text) > 4096:
        raise ValueError("bad token part")
    return b64url.decode(text)
