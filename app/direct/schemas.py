"""Request and response models of Direct Get reads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import Message, Strict, SubjectFilter, TimeText, UInt64, exclusive, rules


class MultiRequest(Strict):
    """Last message of each subject (filters allowed), all as of one stream sequence."""

    model_config = ConfigDict(json_schema_extra=rules(exclusive("up_to_seq", "up_to_time")))

    subjects: list[SubjectFilter] = Field(min_length=1, fail_fast=True)
    up_to_seq: UInt64 | None = Field(default=None, ge=1)
    up_to_time: TimeText | None = Field(default=None, description="RFC 3339")
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
