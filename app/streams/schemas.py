"""Request and response models of streams."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import (
    LEAST_MAX_AGE,
    MAX_GO_INT,
    Duration,
    Int64,
    StartTime,
    StreamName,
    Strict,
    StrMap,
    SubjectFilter,
    UInt64,
    apart,
    colliding,
    differs,
    disjoint,
    duration,
    exclusive,
    rules,
    same,
    transform,
    when,
)


class Placement(Strict):
    """Where a stream's replicas go. (nats-server refuses a ``preferred`` server in a stream's
    placement, on every release: it names a leader in a step-down request only.)"""

    cluster: str | None = None
    tags: list[str] | None = Field(default=None, fail_fast=True)


class SubjectTransform(Strict):
    model_config = ConfigDict(json_schema_extra=rules(transform("src", "dest")))

    src: SubjectFilter
    dest: SubjectFilter


class Republish(Strict):
    model_config = ConfigDict(json_schema_extra=rules(transform("src", "dest")))

    src: SubjectFilter | None = None
    dest: SubjectFilter
    headers_only: bool | None = None


class ExternalStream(Strict):
    api: str
    deliver: str | None = None


class StreamSource(Strict):
    model_config = ConfigDict(
        json_schema_extra=rules(
            exclusive("filter_subject", "subject_transforms"),
            # a stream that sources or mirrors itself is a cycle
            differs("name", "stream", unless="external"),
            disjoint("subject_transforms", "src"),
        )
    )

    name: StreamName
    opt_start_seq: UInt64 | None = None
    opt_start_time: StartTime | None = None
    filter_subject: SubjectFilter | None = None
    subject_transforms: list[SubjectTransform] | None = Field(default=None, fail_fast=True)
    external: ExternalStream | None = None
    domain: str | None = None


class ConsumerLimits(Strict):
    inactive_threshold: Duration | None = None
    max_ack_pending: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)


class StreamConfig(Strict):
    """A JetStream StreamConfig with NATS field names; durations in seconds or '30s'."""

    # nats-server's own rules for a stream config (server/stream.go, checkStreamCfg), those a
    # request can break by itself.
    model_config = ConfigDict(
        json_schema_extra=rules(
            same("name", "stream"),
            duration("max_age", minimum=LEAST_MAX_AGE, zero=True),
            duration("duplicate_window", minimum=0.1, zero=True, not_above="max_age"),
            duration("subject_delete_marker_ttl", minimum=1, zero=True),
            disjoint("subjects"),
            apart(
                "republish.dest",
                subjects="subjects",
                otherwise="{stream}",
                unless=("mirror", "sources"),
            ),
            when("subjects", equals=">", requires=("no_ack=true",), forbids=("num_replicas>1",)),
            colliding(
                "subjects",
                ("$JS.>", "$JSC.>", "$NRG.>", "$SYS.>"),
                unless=("$JS.EVENT.>", "$SYS.ACCOUNT.>"),
                requires="no_ack=true",
            ),
            exclusive("deny_purge=true", "allow_rollup_hdrs=true"),
            when(
                "allow_msg_counter",
                equals=True,
                forbids=(
                    "discard=new",
                    "allow_msg_ttl=true",
                    "allow_msg_schedules=true",
                    "retention=interest|workqueue",
                ),
            ),
            when(
                "discard_new_per_subject",
                equals=True,
                requires=("discard=new", "max_msgs_per_subject>0"),
            ),
            when("allow_msg_schedules", equals=True, forbids=("discard=new", "sources")),
            when("mirror_direct", equals=True, requires=("mirror",)),
            when(
                "persist_mode",
                equals="async",
                forbids=("storage=memory", "num_replicas>1", "allow_atomic=true"),
            ),
            when(
                "mirror",
                forbids=(
                    "first_seq>0",
                    "subjects",
                    "sources",
                    "allow_msg_counter=true",
                    "allow_atomic=true",
                    "allow_msg_schedules=true",
                    "subject_delete_marker_ttl>0",
                ),
            ),
        )
    )

    name: StreamName | None = None
    description: str | None = Field(default=None, max_length=4096)
    subjects: list[SubjectFilter] | None = Field(default=None, fail_fast=True)
    retention: Literal["limits", "interest", "workqueue"] | None = None
    max_consumers: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)
    max_msgs: Int64 | None = None
    max_bytes: Int64 | None = None
    max_age: Duration | None = None
    max_msgs_per_subject: Int64 | None = None
    max_msg_size: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    discard: Literal["old", "new"] | None = None
    storage: Literal["file", "memory"] | None = None
    num_replicas: int | None = Field(default=None, ge=1, le=5)
    no_ack: bool | None = None
    duplicate_window: Duration | None = None
    placement: Placement | None = None
    mirror: StreamSource | None = None
    sources: list[StreamSource] | None = Field(default=None, fail_fast=True)
    compression: Literal["none", "s2"] | None = None
    # (below 10^19: revisions and cursors are up to 19 digits, app.validation.REVISION_DIGITS)
    first_seq: int | None = Field(default=None, ge=0, le=10**19 - 1)
    subject_transform: SubjectTransform | None = None
    republish: Republish | None = None
    allow_direct: bool | None = None
    mirror_direct: bool | None = None
    discard_new_per_subject: bool | None = None
    sealed: bool | None = None
    deny_delete: bool | None = None
    deny_purge: bool | None = None
    allow_rollup_hdrs: bool | None = None
    consumer_limits: ConsumerLimits | None = None
    allow_msg_ttl: bool | None = None
    subject_delete_marker_ttl: Duration | None = None
    allow_msg_counter: bool | None = None
    allow_atomic: bool | None = None
    allow_msg_schedules: bool | None = None
    persist_mode: Literal["default", "async"] | None = None
    metadata: StrMap | None = None

    def to_nats(self, name: str) -> dict[str, Any]:
        body = self.model_dump(exclude_none=True)
        body["name"] = name
        return body


class StreamSummary(BaseModel):
    name: str
    subjects: list[str]
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    consumer_count: int
    created: str | None = None


class StreamList(BaseModel):
    streams: list[StreamSummary]
    total: int
    offset: int
    limit: int


class StreamInfo(BaseModel):
    """Stream config (durations in seconds) and state as the server reports them."""

    config: dict[str, Any]
    state: dict[str, Any]
    created: str | None = None
    cluster: dict[str, Any] | None = None
    mirror: dict[str, Any] | None = None
    sources: list[dict[str, Any]] | None = None


class PurgeRequest(Strict):
    model_config = ConfigDict(json_schema_extra=rules(exclusive("seq", "keep")))

    filter: SubjectFilter | None = None
    seq: UInt64 | None = Field(default=None, ge=1)
    keep: UInt64 | None = None


class PurgeResult(BaseModel):
    purged: int
