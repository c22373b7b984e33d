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
    model_validator,
)

from app import validation
from app.durations import parse_duration_ns, parse_time, time_for_nats

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
# Go's int: the upper bound of every count and limit in a NATS config. A larger number would
# not even reach the server: the JSON encoder refuses integers past 64 bits (a 500).
MAX_GO_INT = 2**63 - 1


class Strict(BaseModel):
    # strict: JSON types are taken as they are, so "5", 5.0 or true is no integer and "yes"
    # or 1 no boolean; lax coercion would turn {"keep": true} into a purge keeping 1 message.
    model_config = ConfigDict(extra="forbid", strict=True)


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
    max_ack_pending: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)


class StreamConfig(Strict):
    """A JetStream StreamConfig with NATS field names; durations in seconds or '30s'."""

    name: StreamName | None = None
    description: str | None = Field(default=None, max_length=4096)
    subjects: list[SubjectFilter] | None = None
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


# -- pull consumers --------------------------------------------------------------------------

ConsumerName = Annotated[str, _check(validation.consumer_name)]
GroupName = Annotated[str, _check(validation.group_name)]


def _time_for_nats(value: str) -> str:
    return time_for_nats(parse_time(value))


Time = Annotated[
    str, AfterValidator(_time_for_nats), WithJsonSchema({"type": "string", "format": "date-time"})
]
"""An RFC 3339 time in a request, passed on in the form the JetStream API wants."""

# Settings that only push consumers have: refused with a clear message rather than as
# unknown fields, since the gateway manages pull consumers only.
_PUSH_ONLY = ("deliver_subject", "deliver_group", "idle_heartbeat", "flow_control", "rate_limit_bps")


class ConsumerConfig(Strict):
    """A durable pull consumer's ConsumerConfig (NATS field names); durations in seconds or '30s'.

    ``ack_policy`` defaults to ``explicit``. ADR-42: ``priority_groups`` (1-16 characters of
    ``A-Za-z0-9-_/=``) go with a ``priority_policy`` and explicit acks; ``priority_timeout``
    is how long a pinned client may stay silent before the server pins another one.
    """

    name: ConsumerName | None = None
    durable_name: ConsumerName | None = None
    description: str | None = Field(default=None, max_length=4096)
    deliver_policy: (
        Literal["all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"]
        | None
    ) = None
    opt_start_seq: UInt64 | None = None
    opt_start_time: Time | None = None
    ack_policy: Literal["none", "all", "explicit"] = "explicit"
    ack_wait: Duration | None = None
    max_deliver: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)
    backoff: list[Duration] | None = None
    filter_subject: SubjectFilter | None = None
    filter_subjects: list[SubjectFilter] | None = None
    replay_policy: Literal["instant", "original"] | None = None
    sample_freq: str | None = Field(default=None, pattern=r"\A[0-9]{1,3}%?\z")
    max_waiting: int | None = Field(default=None, ge=1, le=MAX_GO_INT)
    max_ack_pending: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)
    headers_only: bool | None = None
    max_batch: int | None = Field(default=None, ge=0, le=MAX_GO_INT)
    max_expires: Duration | None = None
    max_bytes: int | None = Field(default=None, ge=0, le=MAX_GO_INT)
    inactive_threshold: Duration | None = None
    num_replicas: int | None = Field(default=None, ge=0, le=5)
    mem_storage: bool | None = None
    metadata: dict[str, str] | None = None
    pause_until: Time | None = None
    priority_groups: list[GroupName] | None = None
    priority_policy: Literal["none", "overflow", "pinned_client", "prioritized"] | None = None
    priority_timeout: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _pull_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in _PUSH_ONLY:
                if key in data:
                    raise ValueError(
                        f"{key!r} is a push consumer setting: the gateway manages pull consumers only"
                    )
        return data


class PriorityGroupState(BaseModel):
    """As nats-server reports it (not ADR-42's ``name``/``pinned_id``)."""

    group: str
    pinned_client_id: str | None = None
    pinned_ts: str | None = None


class ConsumerInfo(BaseModel):
    """Consumer config (durations in seconds) and state as the server reports them."""

    stream_name: str
    name: str
    created: str | None = None
    config: dict[str, Any]
    delivered: dict[str, Any]
    ack_floor: dict[str, Any]
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    num_pending: int
    paused: bool | None = None
    pause_remaining: float | None = None
    priority_groups: list[PriorityGroupState] | None = None
    cluster: dict[str, Any] | None = None
    ts: str | None = None


class ConsumerList(BaseModel):
    consumers: list[ConsumerInfo]
    total: int
    offset: int
    limit: int


class PullOptions(Strict):
    expires: Duration | None = Field(
        default=None, description="how long the server holds the pull: 1 s up to the gateway's "
        "maximum (default 5 s; with no_wait, unset means answer at once)"
    )  # fmt: skip
    idle_heartbeat: Duration | None = Field(
        default=None, description="0.5-30 s, at most half of expires (default 5 s when expires > 30 s)"
    )
    no_wait: bool = Field(default=False, description="end as soon as no message is available")
    group: GroupName | None = Field(default=None, description="ADR-42 priority group")
    min_pending: int | None = Field(default=None, ge=1, le=2**63 - 1, description="overflow")
    min_ack_pending: int | None = Field(default=None, ge=1, le=2**63 - 1, description="overflow")
    priority: int | None = Field(default=None, ge=0, le=9, description="prioritized (0 first)")


class NextRequest(PullOptions):
    """Pull one message."""


class FetchRequest(PullOptions):
    """Pull up to ``max_messages`` messages (default 1) or up to ``max_bytes`` bytes."""

    max_messages: int | None = Field(default=None, ge=1)
    max_bytes: int | None = Field(default=None, ge=1)


class ConsumeQuery(Strict):
    """ADR-37 consume options; thresholds default to half the buffer."""

    # Query parameters are text: numbers come as "100" and must be parsed.
    model_config = ConfigDict(extra="forbid", strict=False)

    group: GroupName | None = None
    max_messages: int | None = Field(default=None, ge=1, description="buffer (default 100)")
    max_bytes: int | None = Field(default=None, ge=1, description="buffer in bytes instead")
    expires: Duration | None = Field(default=None, description="of each pull (default 30 s)")
    idle_heartbeat: Duration | None = Field(
        default=None, description="default half of expires, 0.5-30 s"
    )
    threshold_messages: int | None = Field(default=None, ge=0)
    threshold_bytes: int | None = Field(default=None, ge=0)
    min_pending: int | None = Field(default=None, ge=1, le=2**63 - 1)
    min_ack_pending: int | None = Field(default=None, ge=1, le=2**63 - 1)
    priority: int | None = Field(default=None, ge=0, le=9)
    access_token: str | None = Field(
        default=None, description="a short-lived SSE token, for EventSource clients that "
        "cannot send an Authorization header (see POST /v1/auth/sse-token)"
    )  # fmt: skip


class DeliveredMessage(Message):
    """A message pulled from a consumer, with what it takes to ack it."""

    ack_token: str = Field(description="opaque, signed, bound to this stream and consumer")
    delivered: int = Field(description="delivery count (1 = first delivery)")
    consumer_seq: int
    pending: int = Field(description="messages left for the consumer after this one")


class FetchResult(BaseModel):
    messages: list[DeliveredMessage]
    pin_id: str | None = Field(
        default=None, description="send it back in the Nats-Pin-Id header; absent: send none"
    )


class AckItem(Strict):
    token: str = Field(min_length=1, max_length=1024)
    kind: Literal["ack", "nak", "wpi", "term"] = "ack"
    delay: Duration | None = Field(default=None, description="nak only: redeliver after this")
    reason: str | None = Field(default=None, max_length=1024, description="term only")


class AckBatch(Strict):
    acks: list[AckItem] = Field(min_length=1)


class AckResult(BaseModel):
    index: int
    ok: bool
    seq: int | None = Field(default=None, description="stream sequence of the message")
    error: dict[str, Any] | None = None


class AckBatchResult(BaseModel):
    results: list[AckResult]


class UnpinRequest(Strict):
    group: GroupName


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    nats: dict[str, Any] | None = None


# -- KV (ADR-8) ---------------------------------------------------------------------------------


def _kv_value_size(value: int) -> int:
    if value == 0:
        raise ValueError("max_value_size is -1 (unlimited) or at least 1")
    return value


def _kv_marker_ttl(value: int) -> int:
    if 0 < value < 1_000_000_000:
        raise ValueError("limit_marker_ttl is at least 1 second (or 0: off)")
    return value


class KVConfig(Strict):
    """A bucket's settings (ADR-8, ADR-48); durations in seconds or '30s'."""

    history: int = Field(default=1, ge=1, le=64, description="values kept per key")
    ttl: Duration = Field(default=0, description="how long values live; 0: forever")
    max_value_size: Annotated[int, AfterValidator(_kv_value_size)] = Field(
        default=-1, ge=-1, le=2**31 - 1, description="-1: unlimited"
    )
    max_bytes: Int64 = Field(default=-1, description="bucket size limit; -1: unlimited")
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    compression: bool = Field(default=False, description="s2 compression on disk")
    description: str | None = Field(default=None, max_length=4096)
    placement: Placement | None = None
    republish: Republish | None = None
    limit_marker_ttl: Annotated[Duration, AfterValidator(_kv_marker_ttl)] = Field(
        default=0,
        description="keep markers for keys removed by ttl/max age this long (at least 1s); "
        "also enables per-key TTLs. Cannot be turned off once on",
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

    keys: list[str] = Field(min_length=1, description="keys or filters with * and >")
    at_revision: UInt64 | None = Field(default=None, ge=1)
    at_time: str | None = Field(default=None, description="RFC 3339")
    include_deleted: bool = Field(
        default=False, description="report keys deleted/purged at that revision (no value)"
    )


class KVReadResult(BaseModel):
    revision: int = Field(description="every entry is the latest at or before this revision")
    entries: list[KVEntry]


class KVWriteResult(BaseModel):
    revision: int
