"""Request and response models of the HTTP API (NATS field names where NATS has one)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)

from app import validation
from app.durations import parse_duration_ns

_DURATION_SCHEMA = {
    "oneOf": [
        {"type": "number", "minimum": 0, "description": "seconds"},
        {"type": "string", "examples": ["30s", "1h30m", "500ms"]},
    ],
    "description": "seconds, or a Go-style duration string",
}

Duration = Annotated[int, BeforeValidator(parse_duration_ns), WithJsonSchema(_DURATION_SCHEMA)]
"""A duration in a request: seconds or ``"1h30m"``; held as nanoseconds for NATS."""


def _check(fn: Any) -> AfterValidator:
    def run(value: Any) -> Any:
        try:
            return fn(value)
        except validation.InvalidInput as exc:
            raise ValueError(exc.detail) from None

    return AfterValidator(run)


SubjectFilter = Annotated[str, _check(validation.subject_filter)]
Subject = Annotated[str, _check(validation.subject)]
StreamName = Annotated[str, _check(validation.stream_name)]
Int64 = Annotated[int, Field(ge=-1, le=2**63 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Placement(Strict):
    cluster: str | None = None
    tags: list[str] | None = None
    preferred: str | None = None


class SubjectTransform(Strict):
    src: SubjectFilter
    dest: str


class Republish(Strict):
    src: SubjectFilter | None = None
    dest: str
    headers_only: bool | None = None


class ExternalStream(Strict):
    api: str
    deliver: str | None = None


class StreamSource(Strict):
    name: StreamName
    opt_start_seq: UInt64 | None = None
    opt_start_time: str | None = None
    filter_subject: SubjectFilter | None = None
    subject_transforms: list[SubjectTransform] | None = None
    external: ExternalStream | None = None
    domain: str | None = None


class ConsumerLimits(Strict):
    inactive_threshold: Duration | None = None
    max_ack_pending: int | None = Field(default=None, ge=-1)


class StreamConfig(Strict):
    """A JetStream StreamConfig with NATS field names; durations in seconds or '30s'."""

    name: StreamName | None = None
    description: str | None = Field(default=None, max_length=4096)
    subjects: list[SubjectFilter] | None = None
    retention: Literal["limits", "interest", "workqueue"] | None = None
    max_consumers: int | None = Field(default=None, ge=-1)
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
    sources: list[StreamSource] | None = None
    compression: Literal["none", "s2"] | None = None
    first_seq: UInt64 | None = None
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
    metadata: dict[str, str] | None = None

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
    filter: SubjectFilter | None = None
    seq: UInt64 | None = Field(default=None, ge=1)
    keep: UInt64 | None = None


class PurgeResult(BaseModel):
    purged: int


class Message(BaseModel):
    stream: str
    subject: str
    seq: int
    time: str | None
    headers: dict[str, list[str]] = {}
    data: str = Field(description="base64")


class PubAck(BaseModel):
    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None


class PublishItem(Strict):
    subject: str
    data: str = Field(default="", description="base64")
    headers: dict[str, str] | None = Field(
        default=None, description="NATS headers: the publish headers of this API, and user headers"
    )
    msg_id: str | None = None


class PublishBatch(Strict):
    messages: list[PublishItem] = Field(min_length=1)


class PublishResult(BaseModel):
    index: int
    ok: bool
    ack: PubAck | None = None
    error: dict[str, Any] | None = None


class PublishBatchResult(BaseModel):
    results: list[PublishResult]


class MultiRequest(Strict):
    """Last message of each subject (filters allowed), all as of one stream sequence."""

    subjects: list[SubjectFilter] = Field(min_length=1)
    up_to_seq: UInt64 | None = Field(default=None, ge=1)
    up_to_time: str | None = Field(default=None, description="RFC 3339")
    batch: int | None = Field(
        default=None, ge=1, le=1000, description="messages per server request (paging)"
    )


class MultiResult(BaseModel):
    up_to_seq: int = Field(description="every message is the last one at or before this sequence")
    messages: list[Message]


class EndOfBatchLine(BaseModel):
    """The last NDJSON line of a batch read."""

    eob: bool = True
    num_pending: int
    last_seq: int


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    nats: dict[str, Any] | None = None
