"""The data source's options, checked once on the driver with messages that name the option."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.gateway import DEFAULT_MAX_BATCH, Connection

_STREAM = re.compile(r"[a-zA-Z0-9_-]{1,255}")
_BUCKET = re.compile(r"[a-zA-Z0-9_-]+")
_KEY_FILTER_TOKEN = re.compile(r"[-/_=a-zA-Z0-9]+|\*|>")
# Sequences per partition when `partitions` is not given.
DEFAULT_PARTITION_SPAN = 250_000
MAX_DEFAULT_PARTITIONS = 64


class OptionError(ValueError):
    pass


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands options over case-insensitively; plain dicts (jobs, tests) may not.
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _int(options: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    text = _get(options, name)
    if text is None or text == "":
        return None
    if not text.strip().isdigit() or int(text) < minimum:
        raise OptionError(f"option {name!r} must be a whole number >= {minimum}, got {text!r}")
    return int(text)


def _bool(options: Mapping[str, str], name: str) -> bool:
    text = (_get(options, name) or "false").strip().lower()
    if text not in {"true", "false"}:
        raise OptionError(f"option {name!r} must be true or false, got {text!r}")
    return text == "true"


@dataclass(frozen=True, slots=True)
class Options:
    connection: Connection
    stream: str | None
    bucket: str | None
    subject: str | None
    start_sequence: int | None
    end_sequence: int | None
    start_time: str | None
    end_time: str | None
    partitions: int | None
    max_batch: int
    keys: tuple[str, ...]
    as_of_revision: int | None
    as_of_time: str | None
    include_history: bool
    starting_offsets: str
    max_records_per_trigger: int | None
    write_id: str | None
    publish_batch: int
    wire: str
    read_via: str = "auto"

    @property
    def target_stream(self) -> str:
        """The stream to read: the named one, or ``KV_<bucket>``."""
        return self.stream if self.stream else f"KV_{self.bucket}"

    def partition_count(self, span: int) -> int:
        if self.partitions:
            return self.partitions
        return max(1, min(MAX_DEFAULT_PARTITIONS, math.ceil(span / DEFAULT_PARTITION_SPAN)))


def parse(options: Mapping[str, str], *, writing: bool = False) -> Options:
    """Checked options; a write to a stream may name no stream (the subjects decide)."""
    url = _get(options, "url") or _get(options, "gateway")
    if not url:
        raise OptionError(
            "option 'url' (the gateway's base URL, e.g. http://127.0.0.1:8080) is required"
        )
    stream, bucket = _get(options, "stream"), _get(options, "bucket")
    if stream is not None and bucket is not None:
        raise OptionError("give one of the options 'stream' and 'bucket', not both")
    if stream is None and bucket is None and not writing:
        raise OptionError("give one of the options 'stream' and 'bucket'")
    if stream is not None and not _STREAM.fullmatch(stream):
        raise OptionError(f"invalid stream name {stream!r}")
    if bucket is not None and not _BUCKET.fullmatch(bucket):
        raise OptionError(f"invalid bucket name {bucket!r}")
    keys = tuple(k.strip() for k in (_get(options, "keys") or "").split(",") if k.strip())
    for key in keys:
        if not all(_KEY_FILTER_TOKEN.fullmatch(t) for t in key.split(".")) or ">" in key[:-1]:
            raise OptionError(f"invalid key filter {key!r} in option 'keys'")
    if _get(options, "asOfRevision") and _get(options, "asOfTime"):
        raise OptionError("options 'asOfRevision' and 'asOfTime' exclude each other")
    if _get(options, "startSequence") and _get(options, "startTime"):
        raise OptionError("options 'startSequence' and 'startTime' exclude each other")
    if _get(options, "endSequence") and _get(options, "endTime"):
        raise OptionError("options 'endSequence' and 'endTime' exclude each other")
    timeout = float(_get(options, "timeout") or 60)
    return Options(
        connection=Connection(url=url, token=_get(options, "token") or None, timeout=timeout),
        stream=stream,
        bucket=bucket,
        subject=_get(options, "subject") or None,
        start_sequence=_int(options, "startSequence", minimum=1),
        end_sequence=_int(options, "endSequence", minimum=1),
        start_time=_get(options, "startTime") or None,
        end_time=_get(options, "endTime") or None,
        partitions=_int(options, "partitions", minimum=1),
        max_batch=_int(options, "maxBatch", minimum=1) or DEFAULT_MAX_BATCH,
        keys=keys,
        as_of_revision=_int(options, "asOfRevision", minimum=1),
        as_of_time=_get(options, "asOfTime") or None,
        include_history=_bool(options, "includeHistory"),
        starting_offsets=(_get(options, "startingOffsets") or "earliest").strip().lower(),
        max_records_per_trigger=_int(options, "maxRecordsPerTrigger", minimum=1),
        write_id=_get(options, "writeId") or None,
        publish_batch=_int(options, "publishBatch", minimum=1) or 500,
        wire=_wire(options),
        read_via=_read_via(options),
    )


def _read_via(options: Mapping[str, str]) -> str:
    """How a stream's ranges are read: ``auto`` (Direct Get where the stream allows it, else
    the gateway's consumer-backed range read), ``direct`` or ``consumer``."""
    via = (_get(options, "readVia") or "auto").strip().lower()
    if via not in {"auto", "direct", "consumer"}:
        raise OptionError(f"option 'readVia' must be auto, direct or consumer, got {via!r}")
    return via


def _wire(options: Mapping[str, str]) -> str:
    """How batches travel from the gateway: ``arrow`` (NDJSON if the gateway cannot) or
    ``ndjson``."""
    wire = (_get(options, "wire") or "arrow").strip().lower()
    if wire not in {"arrow", "ndjson"}:
        raise OptionError(f"option 'wire' must be arrow or ndjson, got {wire!r}")
    return wire
