"""The JetStream JSON API spoken directly (``$JS.API.*``), with the account's domain applied.

nats-py's JetStream context drops config fields it does not know and cannot speak the newer
parts of the protocol, so the gateway sends the API requests itself. Every subject token it
builds here has been validated by :mod:`app.validation` before it arrives.
"""

from __future__ import annotations

from typing import Any

import orjson

from app import errors
from app.errors import ErrorCode, NoResponders
from app.nats.pool import NatsPool


class JetStreamApi:
    def __init__(self, pool: NatsPool, domain: str | None = None) -> None:
        self.pool = pool
        self.domain = domain
        self.prefix = f"$JS.{domain}.API" if domain else "$JS.API"

    def subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens))

    async def call(
        self,
        operation: str,
        *tokens: str,
        body: dict[str, Any] | None = None,
        write: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One API request; returns the response object or raises the mapped error."""
        payload = orjson.dumps(body) if body is not None else b""
        try:
            msg = await self.pool.request(
                self.subject(*tokens), payload, operation=operation, write=write, timeout=timeout
            )
        except NoResponders:
            raise errors.Unavailable(
                ErrorCode.JETSTREAM_UNAVAILABLE,
                "JetStream did not answer: it is not enabled for this account, "
                "or the domain is wrong",
            ) from None
        return parse_response(msg.data)


def parse_response(data: bytes) -> dict[str, Any]:
    try:
        response = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise errors.UpstreamError(
            ErrorCode.JETSTREAM_BAD_RESPONSE, "JetStream sent invalid JSON"
        ) from None
    if not isinstance(response, dict):
        raise errors.UpstreamError(
            ErrorCode.JETSTREAM_BAD_RESPONSE, "JetStream sent an unexpected reply"
        )
    error = response.get("error")
    if error:
        raise errors.from_jetstream(error)
    return response
