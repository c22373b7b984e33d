"""Request and response models of publishing."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from app import validation
from app.publish import schedules
from app.schemas import (
    MAX_MAP_MEMBERS,
    Strict,
    StrMap,
    atomic_batch,
    distinct_names,
    exclusive,
    rules,
)

# Standard base64 with its padding, as base64.b64decode(validate=True) takes it.
BASE64 = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
PUBLISH_HEADER_NAMES = (
    "Nats-Msg-Id",
    "Nats-Expected-Stream",
    "Nats-Expected-Last-Sequence",
    "Nats-Expected-Last-Subject-Sequence",
    "Nats-Expected-Last-Msg-Id",
    "Nats-TTL",
    *schedules.HEADERS,
)
_TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _but(*chars: str) -> str:
    """A regex class of the header-name characters other than ``chars``."""
    kept = "".join(c for c in _TOKEN if c not in chars)
    return "[" + "".join("\\" + c if c in "-^]\\" else c for c in kept) + "]"


_H = _but()
# A user header: a header name that does not start with "nats-" (any case): only the
# documented Nats-* publish headers below are passed.
_USER_HEADER = (
    f"^({_but('N', 'n')}{_H}*|[Nn]({_but('A', 'a')}{_H}*)?|[Nn][Aa]({_but('T', 't')}{_H}*)?"
    f"|[Nn][Aa][Tt]({_but('S', 's')}{_H}*)?|[Nn][Aa][Tt][Ss]({_but('-')}{_H}*)?)$"
)
_VALUE = {"type": "string", **validation.SCHEMAS["header_value"]}
_SEQUENCE = {"type": "string", "pattern": f"^[0-9]{{1,{validation.REVISION_DIGITS}}}$"}
HEADERS_SCHEMA = {
    "type": "object",
    "maxProperties": MAX_MAP_MEMBERS,
    "description": "NATS headers: the publish headers of this API, and user headers (names "
    "compared without case: a name given twice is refused)",
    "propertyNames": {
        "anyOf": [
            {"pattern": _USER_HEADER},
            {"enum": sorted(PUBLISH_HEADER_NAMES)},
        ],
        # What NATS's status line stands for in clients' header maps.
        "not": {
            "pattern": "^([Ss][Tt][Aa][Tt][Uu][Ss]|[Dd][Ee][Ss][Cc][Rr][Ii][Pp][Tt][Ii][Oo][Nn])$"
        },
    },
    "properties": {
        "Nats-Msg-Id": {**_VALUE, "minLength": 1},
        "Nats-Expected-Stream": {"type": "string", **validation.SCHEMAS["stream"]},
        "Nats-Expected-Last-Sequence": _SEQUENCE,
        "Nats-Expected-Last-Subject-Sequence": _SEQUENCE,
        "Nats-Expected-Last-Msg-Id": {**_VALUE, "minLength": 1},
        "Nats-TTL": {"type": "string", **validation.SCHEMAS["ttl"]},
        **schedules.HEADER_SCHEMAS,
    },
    "additionalProperties": _VALUE,
}


class PubAck(BaseModel):
    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None


class AtomicPubAck(BaseModel):
    """An atomic batch stored whole: its stream, the sequence of its last message, its id
    (Nats-Batch-Id) and how many messages it had."""

    stream: str
    seq: int
    batch: str
    count: int


class PublishItem(Strict):
    model_config = ConfigDict(
        json_schema_extra=rules(
            exclusive("msg_id", "headers.Nats-Msg-Id"),
            distinct_names("headers"),
            *schedules.spec_rules("headers."),
        )
    )

    subject: Annotated[str, WithJsonSchema({"type": "string", **validation.SCHEMAS["subject"]})]
    data: str = Field(
        default="",
        description="base64",
        json_schema_extra={"pattern": BASE64, "contentEncoding": "base64"},
    )
    headers: Annotated[StrMap, WithJsonSchema(HEADERS_SCHEMA)] | None = None
    msg_id: str | None = Field(
        default=None,
        description="Nats-Msg-Id (give it here or in headers, not both)",
        json_schema_extra={**validation.SCHEMAS["header_value"], "minLength": 1},
    )


class PublishBatch(Strict):
    model_config = ConfigDict(json_schema_extra=rules(atomic_batch("messages", "atomic=true")))

    messages: list[PublishItem] = Field(min_length=1, fail_fast=True)


class PublishResult(BaseModel):
    index: int
    ok: bool
    ack: PubAck | None = None
    error: dict[str, Any] | None = None


class PublishBatchResult(BaseModel):
    results: list[PublishResult]
