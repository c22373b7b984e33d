"""Request and response models of publishing."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    Field,
)

from app.schemas import Strict, StrMap


class PubAck(BaseModel):
    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None


class PublishItem(Strict):
    subject: str
    data: str = Field(default="", description="base64")
    headers: StrMap | None = Field(
        default=None, description="NATS headers: the publish headers of this API, and user headers"
    )
    msg_id: str | None = None


class PublishBatch(Strict):
    messages: list[PublishItem] = Field(min_length=1, fail_fast=True)


class PublishResult(BaseModel):
    index: int
    ok: bool
    ack: PubAck | None = None
    error: dict[str, Any] | None = None


class PublishBatchResult(BaseModel):
    results: list[PublishResult]
