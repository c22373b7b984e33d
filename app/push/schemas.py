"""Request and response models of push subscriptions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from app import validation
from app.consumers.schemas import ConsumerConfig, ConsumerName, GroupName
from app.durations import NS_PER_SECOND, ns_to_seconds
from app.errors import GatewayError
from app.schemas import (
    TIME_OR_DURATION_SCHEMA,
    Duration,
    StreamName,
    Strict,
    duration,
    rules,
    when,
)
from app.validation import SCHEMAS

DEFAULT_TIMEOUT = 30
MAX_TIMEOUT = 3600
MAX_CONCURRENCY = 1024
MAX_BATCH = 1000
DEFAULT_GROUP = "jsgw"


def _dead_letter_subject(value: str) -> str:
    try:
        return validation.publish_subject(value)
    except GatewayError as exc:  # invalid (400) or reserved (403): a bad body either way
        raise ValueError(exc.detail) from None


def _timeout(value: int) -> int:
    if not 0 < value <= MAX_TIMEOUT * NS_PER_SECOND:
        raise ValueError(f"timeout is above 0 and at most {MAX_TIMEOUT} s")
    return value


DeadLetterSubject = Annotated[
    str,
    AfterValidator(_dead_letter_subject),
    WithJsonSchema({"type": "string", **SCHEMAS["subject"]}),
]


class DeadLetter(Strict):
    """Where messages go that are not delivered: after ``max_deliver`` failed deliveries, on
    the application's DROP, or refused with a 4xx."""

    subject: DeadLetterSubject = Field(
        description="a subject to publish to (no wildcards, not $JS/$SYS/_INBOX...); when a "
        "stream stores it, each dead letter is stored before its message is terminated"
    )


class Subscription(Strict):
    """A push subscription: the gateway pulls from a durable consumer and POSTs each message
    (or a batch) to ``endpoint``; the answer decides the ack. Durations in seconds or '30s'.

    With ``ordered``, messages are delivered one at a time in stream order by one gateway
    process at a time (a ``pinned_client`` priority group, ADR-42); ``concurrency`` and
    ``batch`` are then 1 whatever is given.
    """

    model_config = ConfigDict(
        json_schema_extra=rules(
            duration("timeout", minimum=0.001, maximum=MAX_TIMEOUT),
            when("format", equals="cloudevents", forbids=("batch>1",)),
        )
    )

    stream: StreamName
    consumer: ConsumerName
    consumer_config: ConsumerConfig | None = Field(
        default=None,
        description="creates the durable pull consumer `consumer` when it does not exist "
        "(an existing one is left as it is); its name, when given, is `consumer`",
    )
    endpoint: str = Field(
        min_length=1,
        max_length=2048,
        description="absolute http(s) URL under a prefix of JSGW_PUSH_ALLOWED_URLS",
        json_schema_extra={"format": "uri", "examples": ["http://127.0.0.1:3000/orders"]},
    )
    concurrency: int = Field(
        default=16, ge=1, le=MAX_CONCURRENCY, description="POSTs in flight, per gateway process"
    )
    batch: int = Field(
        default=1, ge=1, le=MAX_BATCH, description="messages per POST (> 1: a JSON array)"
    )
    timeout: Annotated[Duration, AfterValidator(_timeout)] = Field(
        default=DEFAULT_TIMEOUT * NS_PER_SECOND,
        description="of each POST, until its whole answer (default 30 s)",
    )
    format: Literal["raw", "cloudevents"] = Field(
        default="raw", description="cloudevents: CloudEvents 1.0 binary mode (batch 1 only)"
    )
    ordered: bool = Field(
        default=False, description="one at a time, in stream order, one process at a time"
    )
    group: GroupName = Field(
        default=DEFAULT_GROUP, description="the priority group of an ordered subscription"
    )
    dead_letter: DeadLetter | None = None

    @model_validator(mode="after")
    def _one_at_a_time(self) -> Subscription:
        if self.format == "cloudevents" and self.batch > 1:
            raise ValueError("format cloudevents delivers one message per POST: batch is 1")
        if self.ordered:
            self.concurrency = self.batch = 1
        if self.consumer_config is not None:
            for field in ("name", "durable_name"):
                given = getattr(self.consumer_config, field)
                if given is not None and given != self.consumer:
                    raise ValueError(f"consumer_config.{field} {given!r} is not {self.consumer!r}")
        return self

    @property
    def capacity(self) -> int:
        """Messages a process holds at most: in flight to the application, or waiting for
        a free POST."""
        return self.concurrency * self.batch

    @property
    def timeout_seconds(self) -> float:
        return self.timeout / NS_PER_SECOND

    def out(self) -> dict[str, Any]:
        """The JSON form: what answers show and what the registry stores (durations in
        seconds, so that it reads back as it was given)."""
        body = self.model_dump(exclude_none=True, exclude={"consumer_config", "timeout"})
        body["timeout"] = ns_to_seconds(self.timeout)
        if self.consumer_config is not None:
            body["consumer_config"] = consumer_config_out(self.consumer_config)
        return body


_CONFIG_DURATIONS = ("ack_wait", "max_expires", "inactive_threshold", "priority_timeout")


def consumer_config_out(config: ConsumerConfig) -> dict[str, Any]:
    """A ConsumerConfig as a request would give it, durations in seconds."""
    body = config.model_dump(exclude_none=True)
    for field in _CONFIG_DURATIONS:
        if field in body:
            body[field] = ns_to_seconds(body[field])
    if "backoff" in body:
        body["backoff"] = [ns_to_seconds(value) for value in body["backoff"]]
    return body


class PauseSubscription(Strict):
    """Pause until a time or for a duration; without ``until``, until resumed."""

    until: Annotated[str | int | float, WithJsonSchema(TIME_OR_DURATION_SCHEMA)] | None = None


class LastError(BaseModel):
    time: str = Field(description="RFC 3339")
    detail: str


class SubscriptionState(BaseModel):
    """How the subscription is doing. The counters are this gateway process's since it
    started delivering (the metrics add up every process); the consumer's figures are the
    server's."""

    running: bool = Field(description="this process is pulling from the consumer")
    paused: bool = Field(description="the consumer is paused (every process stops)")
    in_flight: int = Field(description="messages this process holds: POSTed or about to be")
    delivered: int = Field(description="messages POSTed (a message retried counts again)")
    acked: int = Field(description="acks the server confirmed")
    retried: int = Field(description="naks: the message is delivered again later")
    terminated: int = Field(
        description="messages ended undelivered: terminated (dropped, refused, dead-lettered) "
        "or failed on their last delivery (max_deliver)"
    )
    dead_lettered: int = Field(description="messages published to the dead-letter subject")
    last_error: LastError | None
    num_pending: int | None = Field(description="messages the consumer has yet to deliver")
    num_ack_pending: int | None = Field(description="delivered and not yet acked")
    source: Literal["api", "file"] = Field(
        description="api: made through PUT (every process delivers it); file: JSGW_SUBSCRIPTIONS"
    )
    refused: str | None = Field(
        default=None,
        description="why this process does not deliver a stored subscription (its endpoint "
        "is not allowed here)",
    )


class SubscriptionInfo(BaseModel):
    name: str
    config: dict[str, Any] = Field(description="the subscription as given (durations in seconds)")
    state: SubscriptionState


class SubscriptionList(BaseModel):
    subscriptions: list[SubscriptionInfo]
