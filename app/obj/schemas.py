"""Object bucket and object info models (ADR-20)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import (
    LEAST_MAX_AGE,
    Duration,
    Int64,
    Strict,
    at_least_or_zero,
    duration,
    rules,
)
from app.streams.schemas import Placement


class ObjConfig(Strict):
    """An object bucket's settings; durations in seconds or '30s'."""

    model_config = ConfigDict(
        json_schema_extra=rules(duration("ttl", minimum=LEAST_MAX_AGE, zero=True))
    )

    description: str | None = Field(default=None, max_length=4096)
    ttl: Annotated[Duration, at_least_or_zero("ttl", LEAST_MAX_AGE, "forever")] = Field(
        default=0, description="how long objects live; 0: forever"
    )
    max_bytes: Int64 = Field(default=-1, description="bucket size limit; -1: unlimited")
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    compression: bool = Field(default=False, description="s2 compression on disk")
    placement: Placement | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=64)


class ObjStatus(BaseModel):
    """ADR-20's status of an object bucket."""

    bucket: str
    description: str | None = None
    ttl: int | float = Field(description="seconds; 0: objects never expire")
    storage: str
    replicas: int
    sealed: bool
    size: int = Field(description="bytes stored, chunks and meta messages")
    max_bytes: int
    compression: bool
    placement: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    stream: str
    backing_store: Literal["JetStream"] = "JetStream"


class ObjBucketList(BaseModel):
    buckets: list[ObjStatus]


class ObjectLink(BaseModel):
    bucket: str
    name: str | None = Field(default=None, description="absent: a link to the whole bucket")


class ObjectInfoModel(BaseModel):
    """ADR-20's ObjectInfo: the meta of one object (version)."""

    model_config = {"title": "ObjectInfo"}

    bucket: str
    name: str
    nuid: str
    size: int
    chunks: int
    digest: str = Field(description='"SHA-256=" and the URL-safe base64 of the SHA-256')
    mtime: str
    description: str | None
    headers: dict[str, list[str]]
    metadata: dict[str, str]
    deleted: bool = False
    link: ObjectLink | None = None


class ObjectList(BaseModel):
    objects: list[ObjectInfoModel]
