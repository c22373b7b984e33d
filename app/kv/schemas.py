"""Request and response models of KV buckets and entries (ADR-8)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from app import validation
from app.schemas import (
    LEAST_MAX_AGE,
    Duration,
    Int64,
    StreamName,
    Strict,
    Subject,
    TimeText,
    UInt64,
    apart,
    at_least_or_zero,
    checked_string,
    differs,
    disjoint,
    duration,
    exclusive,
    rules,
)
from app.streams.schemas import Placement, Republish

BucketName = Annotated[str, *checked_string(validation.bucket_name, "bucket")]
KeyFilter = Annotated[str, *checked_string(validation.kv_key_filter, "key_filter")]
MAX_ORIGINS = 64
MAX_TOPOLOGY_KEYS = 64


class KVExternal(Strict):
    """Where the origin's JetStream API is, in another account or domain."""

    api: Subject = Field(description="the origin's JetStream API prefix, e.g. $JS.hub.API")
    deliver: Subject | None = Field(default=None, description="deliver prefix")


def _keys_field() -> Any:
    return Field(
        default=None,
        min_length=1,
        max_length=MAX_TOPOLOGY_KEYS,
        fail_fast=True,
        description="key filters (NATS wildcards * and > as whole tokens); default: every key",
    )


class KVOrigin(Strict):
    """A bucket an aggregate copies (ADR-8 KVAggregateOrigin): the keys keep their names."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            differs("bucket", "bucket", unless="external"),
            disjoint("keys"),
        )
    )

    bucket: BucketName
    stream: StreamName | None = Field(
        default=None,
        description="the stream to copy from (a mirror of the bucket); default KV_<bucket>",
    )
    keys: list[KeyFilter] | None = _keys_field()
    external: KVExternal | None = None


class KVAggregate(Strict):
    """ADR-8's Aggregate: a bucket that sources one or more other buckets."""

    writable: bool = Field(
        default=False, description="false: read-only (no subjects, deny delete and purge)"
    )
    origins: list[KVOrigin] = Field(min_length=1, max_length=MAX_ORIGINS, fail_fast=True)


class KVMirrorConfig(Strict):
    """A read replica of a bucket (ADR-8 KVMirrorConfig): a stream that mirrors it."""

    model_config = ConfigDict(json_schema_extra=rules(disjoint("keys")))

    keys: list[KeyFilter] | None = _keys_field()
    history: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="values kept per key; default: the bucket's (1 with external)",
    )
    ttl: Duration | None = Field(
        default=None,
        description="how long values live; 0: forever; default: the bucket's (0 with "
        "external). A mirror of every key (no keys) keeps them no longer than the bucket",
    )
    max_bytes: Int64 = Field(default=-1, description="size limit; -1: unlimited")
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    description: str | None = Field(default=None, max_length=4096)
    placement: Placement | None = None
    external: KVExternal | None = Field(
        default=None, description="the bucket is in another account or domain"
    )


class KVMirror(BaseModel):
    """A mirror of a bucket, with its state as the server reports it."""

    name: str
    bucket: str
    keys: list[str] | None = None
    external: dict[str, Any] | None = None
    lag: int | None = Field(default=None, description="messages the mirror is behind")
    active: int | float | None = Field(
        default=None, description="seconds since the mirror last heard from its origin"
    )
    values: int
    last_revision: int
    storage: str
    replicas: int
    history: int
    ttl: int | float = Field(default=0, description="seconds values live; 0: forever")
    direct: bool = Field(
        default=False,
        description="whether it answers the bucket's Direct Gets (mirror_direct): a mirror of "
        "every key does; one of some keys is read by its own stream name only",
    )
    created: str | None = None
    error: dict[str, Any] | None = None


class KVMirrorList(BaseModel):
    mirrors: list[KVMirror]


class KVAggregateStatus(BaseModel):
    writable: bool
    origins: list[dict[str, Any]] = Field(
        description="{bucket, stream, keys?, external?, lag?, active?} per origin"
    )


def _kv_value_size(value: int) -> int:
    if value == 0:
        raise ValueError("max_value_size is -1 (unlimited) or at least 1")
    return value


class KVConfig(Strict):
    """A bucket's settings (ADR-8, ADR-48); durations in seconds or '30s'."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            duration("ttl", minimum=LEAST_MAX_AGE, zero=True),
            duration("limit_marker_ttl", minimum=1, zero=True),
            apart("republish.dest", otherwise="$KV.{bucket}.>"),
        )
    )

    history: int = Field(default=1, ge=1, le=64, description="values kept per key")
    ttl: Annotated[Duration, at_least_or_zero("ttl", LEAST_MAX_AGE, "forever")] = Field(
        default=0, description="how long values live; 0: forever"
    )
    max_value_size: Annotated[int, AfterValidator(_kv_value_size)] = Field(
        default=-1,
        ge=-1,
        le=2**31 - 1,
        description="-1: unlimited",
        json_schema_extra={"not": {"const": 0}},
    )
    max_bytes: Int64 = Field(default=-1, description="bucket size limit; -1: unlimited")
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    compression: bool = Field(default=False, description="s2 compression on disk")
    description: str | None = Field(default=None, max_length=4096)
    placement: Placement | None = None
    republish: Republish | None = None
    limit_marker_ttl: Annotated[Duration, at_least_or_zero("limit_marker_ttl", 1, "off")] = Field(
        default=0,
        description="keep markers for keys removed by ttl/max age this long (at least 1s); "
        "also enables per-key TTLs. Cannot be turned off once on",
    )
    aggregate: KVAggregate | None = Field(
        default=None,
        description="make the bucket an aggregate of other buckets (ADR-8); left out on an "
        "existing aggregate: its origins and writability stay",
    )


class KVStatus(BaseModel):
    """ADR-8's Status of a bucket, plus its settings."""

    bucket: str
    values: int = Field(description="messages stored, historical values and markers included")
    history: int
    ttl: int | float = Field(description="seconds; 0: values never expire")
    bytes: int
    is_compressed: bool
    backing_store: Literal["JetStream"] = "JetStream"
    storage: str
    replicas: int
    max_value_size: int
    max_bytes: int
    limit_marker_ttl: int | float = Field(description="seconds; 0: no limit markers")
    allow_direct: bool
    stream: str
    created: str | None = None
    last_revision: int = Field(description="the bucket's latest revision (stream sequence)")
    description: str | None = None
    placement: dict[str, Any] | None = None
    republish: dict[str, Any] | None = None
    aggregate: KVAggregateStatus | None = None


class KVBucketList(BaseModel):
    buckets: list[KVStatus]


class KVEntry(BaseModel):
    """ADR-8's Entry. `delta`: how many newer revisions of the key exist (0: the latest)."""

    bucket: str
    key: str
    value: str | None = Field(default=None, description="base64; absent for meta_only")
    revision: int
    created: str | None
    delta: int | None = None
    operation: Literal["PUT", "DEL", "PURGE"]


class KVHistory(BaseModel):
    entries: list[KVEntry]


class KVKeys(BaseModel):
    keys: list[str]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: done")


class KVReadRequest(Strict):
    """Keys or key filters to read together, as of one revision (or time)."""

    model_config = ConfigDict(json_schema_extra=rules(exclusive("at_revision", "at_time")))

    keys: list[
        Annotated[str, WithJsonSchema({"type": "string", **validation.SCHEMAS["key_filter"]})]
    ] = Field(min_length=1, fail_fast=True, description="keys or filters with * and >")
    at_revision: UInt64 | None = Field(default=None, ge=1)
    at_time: TimeText | None = Field(default=None, description="RFC 3339")
    include_deleted: bool = Field(
        default=False, description="report keys deleted/purged at that revision (no value)"
    )


class KVReadResult(BaseModel):
    revision: int = Field(description="every entry is the latest at or before this revision")
    entries: list[KVEntry]


class KVWriteResult(BaseModel):
    revision: int
