"""Request and response models of pull consumers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from app import validation
from app.config import Settings
from app.schemas import (
    MAX_GO_INT,
    TIME_OR_DURATION_SCHEMA,
    Duration,
    Message,
    StartTime,
    Strict,
    StrMap,
    SubjectFilter,
    Time,
    UInt64,
    at_most,
    checked_string,
    count_not_above,
    disjoint,
    duration,
    exclusive,
    rules,
    same,
    when,
)


def _default(setting: str) -> Any:
    """A setting's default: what the spec states for limits an operator may change."""
    return Settings.model_fields[setting].default


DEFAULT_MAX_FETCH_EXPIRES = _default("max_fetch_expires")
FETCH_EXPIRES = 5  # seconds: a fetch's or next's expires when not given
CONSUME_EXPIRES = 30  # seconds: each pull of a consume
CONSUME_MAX_MESSAGES = 100  # a consume's buffer when neither max_messages nor max_bytes
_POLICIES = "overflow|pinned_client|prioritized"

ConsumerName = Annotated[str, *checked_string(validation.consumer_name, "consumer")]
GroupName = Annotated[str, *checked_string(validation.group_name, "group")]


# Settings that only push consumers have: refused with a clear message rather than as
# unknown fields, since the gateway manages pull consumers only.
_PUSH_ONLY = (
    "deliver_subject",
    "deliver_group",
    "idle_heartbeat",
    "flow_control",
    "rate_limit_bps",
)


class ConsumerConfig(Strict):
    """A durable pull consumer's ConsumerConfig (NATS field names); durations in seconds or '30s'.

    ``ack_policy`` defaults to ``explicit``. ADR-42: ``priority_groups`` (1-16 characters of
    ``A-Za-z0-9-_/=``) go with a ``priority_policy`` and explicit acks; ``priority_timeout``
    is how long a pinned client may stay silent before the server pins another one.
    """

    model_config = ConfigDict(
        json_schema_extra=rules(
            when("priority_timeout>0", requires=(f"priority_policy={_POLICIES}",)),
            when("priority_groups", requires=(f"priority_policy={_POLICIES}",)),
            when("priority_policy", equals=_POLICIES.split("|"), requires=("priority_groups",)),
            when("priority_groups", forbids=("ack_policy=none|all",)),
            when("opt_start_seq>0", requires=("deliver_policy=by_start_sequence",)),
            when("opt_start_time", requires=("deliver_policy=by_start_time",)),
            when("deliver_policy", equals="by_start_sequence", requires=("opt_start_seq>0",)),
            when(
                "deliver_policy",
                equals="last_per_subject",
                requires=("filter_subject|filter_subjects",),
            ),
            count_not_above("backoff", "max_deliver"),
            duration("max_expires", minimum=0.001, zero=True),
            when("deliver_policy", equals="by_start_time", requires=("opt_start_time",)),
            same("name", "consumer"),
            exclusive("filter_subject", "filter_subjects"),
            disjoint("filter_subjects"),
            same("durable_name", "consumer"),
        )
    )

    name: ConsumerName | None = None
    durable_name: ConsumerName | None = None
    description: str | None = Field(default=None, max_length=4096)
    deliver_policy: (
        Literal["all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"]
        | None
    ) = None
    opt_start_seq: UInt64 | None = None
    opt_start_time: StartTime | None = None
    ack_policy: Literal["none", "all", "explicit"] = "explicit"
    ack_wait: Duration | None = None
    max_deliver: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)
    backoff: list[Duration] | None = Field(default=None, fail_fast=True)
    filter_subject: SubjectFilter | None = None
    filter_subjects: list[SubjectFilter] | None = Field(default=None, fail_fast=True)
    replay_policy: Literal["instant", "original"] | None = None
    sample_freq: str | None = Field(default=None, pattern=r"^[0-9]{1,3}%?$")
    max_waiting: int | None = Field(default=None, ge=1, le=MAX_GO_INT)
    max_ack_pending: int | None = Field(default=None, ge=-1, le=MAX_GO_INT)
    headers_only: bool | None = None
    max_batch: int | None = Field(default=None, ge=0, le=MAX_GO_INT)
    max_expires: Duration | None = None
    max_bytes: int | None = Field(default=None, ge=0, le=MAX_GO_INT)
    inactive_threshold: Duration | None = None
    num_replicas: int | None = Field(default=None, ge=0, le=5)
    mem_storage: bool | None = None
    metadata: StrMap | None = None
    pause_until: Time | None = None
    priority_groups: list[GroupName] | None = Field(default=None, fail_fast=True)
    priority_policy: Literal["none", "overflow", "pinned_client", "prioritized"] | None = None
    priority_timeout: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _pull_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in _PUSH_ONLY:
                if key in data:
                    raise ValueError(
                        f"{key!r} is a push consumer setting: "
                        "the gateway manages pull consumers only"
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


_GROUPED = tuple(
    when(name, requires=("group",))
    for name in ("min_pending", "min_ack_pending", "priority", "Nats-Pin-Id")
)
# A consume's query (its parameters, so the operation states them: app/routers consumers).
CONSUME_RULES = (
    exclusive("max_messages", "max_bytes"),
    duration("expires", minimum=1, maximum=DEFAULT_MAX_FETCH_EXPIRES),
    duration("idle_heartbeat", minimum=0.5, maximum=30, half_of="expires", default=CONSUME_EXPIRES),
    at_most("threshold_messages", "max_messages", default=CONSUME_MAX_MESSAGES),
    at_most("threshold_bytes", "max_bytes", default=0),
    *_GROUPED,
)
PULL_RULES = (
    duration("expires", minimum=1, maximum=DEFAULT_MAX_FETCH_EXPIRES),
    # and at most half of expires (5 s when expires is not given and no_wait is not set)
    duration(
        "idle_heartbeat",
        minimum=0.5,
        maximum=30,
        zero=True,
        half_of="expires",
        default=FETCH_EXPIRES,
        none_when="no_wait=true",
    ),
    *_GROUPED,
)


class PullOptions(Strict):
    expires: Duration | None = Field(
        default=None,
        description="how long the server holds the pull: 1 s up to the gateway's "
        "maximum (default 5 s; with no_wait, unset means answer at once)",
    )
    idle_heartbeat: Duration | None = Field(
        default=None,
        description="0.5-30 s, at most half of expires (default 5 s when expires > 30 s)",
    )
    no_wait: bool = Field(default=False, description="end as soon as no message is available")
    group: GroupName | None = Field(default=None, description="ADR-42 priority group")
    min_pending: int | None = Field(default=None, ge=1, le=2**63 - 1, description="overflow")
    min_ack_pending: int | None = Field(default=None, ge=1, le=2**63 - 1, description="overflow")
    priority: int | None = Field(default=None, ge=0, le=9, description="prioritized (0 first)")


class NextRequest(PullOptions):
    """Pull one message."""

    model_config = ConfigDict(json_schema_extra=rules(*PULL_RULES))


class FetchRequest(PullOptions):
    """Pull up to ``max_messages`` messages (default 1) or up to ``max_bytes`` bytes."""

    model_config = ConfigDict(
        json_schema_extra=rules(*PULL_RULES, exclusive("max_messages", "max_bytes"))
    )

    max_messages: int | None = Field(
        default=None,
        ge=1,
        json_schema_extra={"maximum": _default("max_fetch_messages")},
        description="at most JSGW_MAX_FETCH_MESSAGES",
    )
    max_bytes: int | None = Field(
        default=None,
        ge=1,
        json_schema_extra={"maximum": _default("max_fetch_bytes")},
        description="at most JSGW_MAX_FETCH_BYTES",
    )


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
        default=None,
        description="a short-lived SSE token, for EventSource clients that "
        "cannot send an Authorization header (see POST /v1/auth/sse-token)",
    )


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
    acks: list[AckItem] = Field(min_length=1, fail_fast=True)


class AckResult(BaseModel):
    index: int
    ok: bool
    seq: int | None = Field(default=None, description="stream sequence of the message")
    error: dict[str, Any] | None = None


class AckBatchResult(BaseModel):
    results: list[AckResult]


class UnpinRequest(Strict):
    group: GroupName


class PauseRequest(Strict):
    """Pause the consumer until a time, or for a duration: it delivers nothing meanwhile."""

    until: Annotated[str | int | float, WithJsonSchema(TIME_OR_DURATION_SCHEMA)]


class PauseState(BaseModel):
    paused: bool
    pause_until: str | None = Field(default=None, description="RFC 3339, while paused")
    pause_remaining: float | None = Field(default=None, description="seconds, while paused")
