"""The KV data model of ADR-8, without I/O: names, subjects, operations, entries, bucket config.

Everything that maps a bucket onto its stream lives here, so that the KV service, the watch
machinery and the multi-key read share one definition of what a bucket and an entry are.
Bucket names and keys reaching these functions have been validated (:mod:`app.validation`).
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app import errors
from app.durations import NS_PER_SECOND, nats_time, ns_to_seconds, time_from_ns
from app.errors import ErrorCode
from app.nats.direct import StoredMessage
from app.nats.scan import Delivery
from app.validation import REVISION_TAG

STREAM_PREFIX = "KV_"
PUT, DEL, PURGE = "PUT", "DEL", "PURGE"

OPERATION_HEADER = "KV-Operation"
ROLLUP_HEADER = "Nats-Rollup"
EXPECTED_HEADER = "Nats-Expected-Last-Subject-Sequence"
TTL_HEADER = "Nats-TTL"
# nats-server 2.11+ (ADR-48): markers the server places itself carry this instead of KV-Operation.
MARKER_REASON_HEADER = "Nats-Marker-Reason"
_MARKER_OPERATIONS = {"MaxAge": PURGE, "Purge": PURGE, "Remove": DEL}

MAX_DUPLICATE_WINDOW_NS = 120 * NS_PER_SECOND
MAX_REVISION = 2**64 - 1


# -- names and subjects ---------------------------------------------------------------------


def stream_name(bucket: str) -> str:
    """The stream behind a bucket: ``KV_<bucket>``."""
    return f"{STREAM_PREFIX}{bucket}"


def bucket_of_stream(stream: str) -> str | None:
    return stream[len(STREAM_PREFIX) :] if stream.startswith(STREAM_PREFIX) else None


def key_prefix(bucket: str) -> str:
    return f"$KV.{bucket}."


def key_subject(bucket: str, key: str) -> str:
    """The subject a key is stored on: ``$KV.<bucket>.<key>``."""
    return f"{key_prefix(bucket)}{key}"


def filter_subject(bucket: str, key_filter: str) -> str:
    """The subject filter for a key filter (``*`` / ``>`` wildcards, or a literal key)."""
    return f"{key_prefix(bucket)}{key_filter}"


def key_of(bucket: str, subject: str) -> str:
    prefix = key_prefix(bucket)
    if not subject.startswith(prefix) or len(subject) == len(prefix):
        raise ValueError(f"subject {subject!r} is not a key of bucket {bucket!r}")
    return subject[len(prefix) :]


@contextlib.contextmanager
def bucket_errors(bucket: str) -> Iterator[None]:
    """A missing stream (or no stream capturing the key's subject) is a missing bucket."""
    try:
        yield
    except errors.NotFound as exc:
        raise as_bucket_error(bucket, exc) from None


def as_bucket_error(bucket: str, exc: errors.NotFound) -> errors.NotFound:
    if isinstance(exc, (errors.StreamNotFound, errors.StreamNoMatch)):
        return errors.NotFound(ErrorCode.KV_BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
    return exc


# -- operations and entries -----------------------------------------------------------------


def _first(headers: Mapping[str, Any] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if isinstance(value, list):
        return value[0] if value else None
    return value


def operation_of(headers: Mapping[str, Any] | None) -> str:
    """PUT, DEL or PURGE, from ``KV-Operation`` or a server marker's ``Nats-Marker-Reason``.

    Works on nats-py's folded headers (``{name: value}``) and on ``{name: [values]}``.
    """
    operation = _first(headers, OPERATION_HEADER)
    if operation in (DEL, PURGE):
        return operation
    reason = _first(headers, MARKER_REASON_HEADER)
    if reason is not None:
        # A marker reason ADR-48 does not name still means the value is gone: a delete.
        return _MARKER_OPERATIONS.get(reason, DEL)
    return PUT


@dataclass(frozen=True, slots=True)
class Entry:
    """ADR-8's Entry. ``value`` is None for meta-only reads; ``delta`` None when unknown."""

    bucket: str
    key: str
    revision: int
    created: str | None
    operation: str
    value: bytes | None
    delta: int | None = None
    # The stream that answered (a mirror's name when a mirror served a Direct Get), for the
    # KV-Served-By header; not part of what the entry is.
    stream: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bucket": self.bucket, "key": self.key}
        if self.value is not None:
            out["value"] = base64.b64encode(self.value).decode()
        out["revision"] = self.revision
        out["created"] = self.created
        if self.delta is not None:
            out["delta"] = self.delta
        out["operation"] = self.operation
        return out


def entry_from_message(bucket: str, message: StoredMessage, *, delta: int | None = None) -> Entry:
    """The Entry a stored message (Direct Get, STREAM.MSG.GET) of a bucket stands for."""
    return Entry(
        bucket=bucket,
        key=key_of(bucket, message.subject),
        revision=message.seq,
        created=nats_time(message.time),
        operation=operation_of(message.headers),
        value=message.data,
        delta=delta,
        stream=message.stream or None,
    )


def entry_from_delivery(
    bucket: str, message: Delivery, *, meta_only: bool = False, delta: int | None = None
) -> Entry:
    """The Entry a message delivered by a consumer on a bucket stands for; ``delta`` defaults
    to the consumer's pending count (ADR-8's delta in watches)."""
    return Entry(
        bucket=bucket,
        key=key_of(bucket, message.subject),
        revision=message.stream_seq,
        created=time_from_ns(message.timestamp_ns),
        operation=operation_of(message.headers),
        value=None if meta_only else message.data,
        delta=message.pending if delta is None else delta,
        stream=stream_name(bucket),
    )


# -- preconditions (HTTP entity tags carry revisions) ---------------------------------------


def etag(revision: int) -> str:
    return f'"{revision}"'


_REVISION_TAG = re.compile(REVISION_TAG)


def revision_of_tag(tag: str) -> int | None:
    """The revision in one strong entity tag (``"12"``, or bare ``12``), or None."""
    text = tag.strip()
    if _REVISION_TAG.fullmatch(text) is None:
        return None
    return int(text.strip('"'))


def if_none_match_hits(header: str | None, revision: int) -> bool:
    """For a conditional GET: does ``If-None-Match`` name the current revision (or ``*``)?"""
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):  # If-None-Match compares weakly (RFC 9110 13.1.2)
            tag = tag[2:]
        if revision_of_tag(tag) == revision:
            return True
    return False


ANY_REVISION = -1
"""``If-Match: *``: the key must currently hold a value."""


@dataclass(frozen=True, slots=True)
class Precondition:
    """What a write expects: nothing, to create (``If-None-Match: *``), or a revision."""

    create: bool = False
    revision: int | None = None  # a revision, or ANY_REVISION

    @classmethod
    def from_headers(cls, if_match: str | None, if_none_match: str | None) -> Precondition:
        if if_match is not None and if_none_match is not None:
            raise errors.InvalidInput(
                ErrorCode.KV_PRECONDITION_INVALID, "give If-Match or If-None-Match, not both"
            )
        if if_none_match is not None:
            if if_none_match.strip() != "*":
                raise errors.InvalidInput(
                    ErrorCode.KV_PRECONDITION_INVALID,
                    'a write takes only "If-None-Match: *" (create the key if it has no value)',
                )
            return cls(create=True)
        if if_match is not None:
            if if_match.strip() == "*":
                return cls(revision=ANY_REVISION)
            revision = revision_of_tag(if_match)
            if revision is None:
                raise errors.InvalidInput(
                    ErrorCode.KV_REVISION_INVALID,
                    f'If-Match must be one revision as an entity tag, like "12", or *; '
                    f"got {if_match!r}",
                )
            return cls(revision=revision)
        return cls()


# -- bucket configuration and status --------------------------------------------------------


def stream_config(bucket: str, config: Any, existing: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stream config ADR-8 prescribes for a bucket (``config`` is a schemas.KVConfig).

    ``existing`` is the stream's current config when updating: message TTLs, once allowed,
    cannot be switched off (the server refuses it), so they stay on.
    """
    ttl = config.ttl
    duplicate_window = min(ttl, MAX_DUPLICATE_WINDOW_NS) if ttl else MAX_DUPLICATE_WINDOW_NS
    body: dict[str, Any] = {
        "name": stream_name(bucket),
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": config.history,
        "max_msgs": -1,
        "max_bytes": config.max_bytes,
        "max_age": ttl,
        "max_msg_size": config.max_value_size,
        "storage": config.storage,
        "discard": "new",
        "num_replicas": config.replicas,
        "duplicate_window": duplicate_window,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "allow_direct": True,
        "compression": "s2" if config.compression else "none",
    }
    if config.description is not None:
        body["description"] = config.description
    if config.placement is not None:
        body["placement"] = config.placement.model_dump(exclude_none=True)
    if config.republish is not None:
        body["republish"] = config.republish.model_dump(exclude_none=True)
    if config.limit_marker_ttl:
        # ADR-48: limit markers are per-message TTLs plus subject delete markers.
        body["allow_msg_ttl"] = True
        body["subject_delete_marker_ttl"] = config.limit_marker_ttl
    elif existing and existing.get("allow_msg_ttl"):
        body["allow_msg_ttl"] = True
    aggregate = config.aggregate
    if aggregate is not None:
        sources = [origin_source(bucket, origin) for origin in aggregate.origins]
        _aggregated(body, sources, writable=aggregate.writable, existing=existing)
    elif existing and existing.get("sources"):
        # An aggregate's settings changed without `aggregate`: its origins stay as they are.
        _aggregated(
            body, existing["sources"], writable=not is_read_only(existing), existing=existing
        )
    return body


def _aggregated(
    body: dict[str, Any],
    sources: list[dict[str, Any]],
    *,
    writable: bool,
    existing: Mapping[str, Any] | None,
) -> None:
    """ADR-8's Aggregate: the bucket's config plus ``sources``; read-only, it has no subjects
    and denies deletes and purges (so no roll-ups either, which the server ties to purges)."""
    body["sources"] = sources
    if not writable:
        body["subjects"] = []
    if not writable or (existing and existing.get("deny_purge")):  # deny_purge stays on
        body["deny_purge"] = True
        body.pop("allow_rollup_hdrs", None)


def taking_copied_rollups(
    body: dict[str, Any], existing: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``body``, the config of a stream that copies a bucket (a mirror, an aggregate), made to
    store the roll-ups it copies (an origin's purges) on a server that refuses them otherwise
    (before 2.14, :func:`app.nats.features.refuses_copied_rollups`): roll-ups allowed and
    purges not denied, where ADR-8 denies purges. Writes stay refused (a mirror and a
    read-only aggregate have no subjects); the stream itself can then be purged through the
    streams API, which ADR-8's config forbids. A stream made with ``deny_purge`` keeps it:
    the server never turns it off (such a copy is to be made again)."""
    if existing is not None and existing.get("deny_purge"):
        return body
    body = {**body, "allow_rollup_hdrs": True}
    body.pop("deny_purge", None)
    return body


def status_from_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """ADR-8's Status of a bucket, from its stream info."""
    config = info.get("config") or {}
    state = info.get("state") or {}
    name = str(config.get("name", ""))
    out: dict[str, Any] = {
        "bucket": bucket_of_stream(name) or name,
        "values": state.get("messages", 0),
        "history": config.get("max_msgs_per_subject", 1),
        "ttl": ns_to_seconds(config.get("max_age", 0)),
        "bytes": state.get("bytes", 0),
        "is_compressed": config.get("compression") == "s2",
        "backing_store": "JetStream",
        "storage": config.get("storage", "file"),
        "replicas": config.get("num_replicas", 1),
        "max_value_size": config.get("max_msg_size", -1),
        "max_bytes": config.get("max_bytes", -1),
        "limit_marker_ttl": ns_to_seconds(config.get("subject_delete_marker_ttl", 0)),
        "allow_direct": bool(config.get("allow_direct")),
        "stream": name,
        "created": nats_time(info.get("created")),
        "last_revision": state.get("last_seq", 0),
    }
    for key in ("description", "placement", "republish"):
        if config.get(key):
            out[key] = config[key]
    aggregate = aggregate_view(name, config, info.get("sources"))
    if aggregate is not None:
        out["aggregate"] = aggregate
    return out


# -- topologies (ADR-8 "Multi-Cluster and Leafnode topologies") -----------------------------


def _transform_destination(prefix: str, key_filter: str) -> str:
    """``prefix`` + the filter, its ``*`` tokens as the source's wildcards: a key keeps its
    name (nats-server takes no ``*`` in a transform's destination)."""
    tokens = key_filter.split(".")
    wildcard = 0
    for index, token in enumerate(tokens):
        if token == "*":
            wildcard += 1
            tokens[index] = f"{{{{wildcard({wildcard})}}}}"
    return prefix + ".".join(tokens)


def origin_source(bucket: str, origin: Any) -> dict[str, Any]:
    """The stream source of an aggregate's origin (a schemas.KVOrigin), as nats.go's KV
    sources are made: each key filter of the origin, ``$KV.<origin>.<filter>``, lands on
    ``$KV.<bucket>.<filter>`` (the keys keep their names)."""
    filters = origin.keys or [">"]
    source: dict[str, Any] = {
        "name": origin.stream or stream_name(origin.bucket),
        "subject_transforms": [
            {
                "src": filter_subject(origin.bucket, key_filter),
                "dest": _transform_destination(key_prefix(bucket), key_filter),
            }
            for key_filter in filters
        ],
    }
    if origin.external is not None:
        source["external"] = origin.external.model_dump(exclude_none=True)
    return source


def source_identity(source: Mapping[str, Any]) -> tuple[str, str | None]:
    """What makes two sources of a stream the same origin: the stream and external API."""
    external = source.get("external") or {}
    return str(source.get("name", "")), external.get("api")


def _origin_of(source: Mapping[str, Any]) -> dict[str, Any]:
    """An origin as an aggregate's status shows it, read back from its stream source."""
    origin: dict[str, Any] = {"stream": source.get("name", "")}
    keys = []
    for transform in source.get("subject_transforms") or []:
        src = str(transform.get("src", ""))
        _, bucket, key_filter = [*src.split(".", 2), "", ""][:3]
        origin["bucket"] = bucket
        keys.append(key_filter)
    if "bucket" not in origin:
        origin["bucket"] = bucket_of_stream(origin["stream"]) or origin["stream"]
    if keys and keys != [">"]:
        origin["keys"] = keys
    if source.get("external"):
        origin["external"] = source["external"]
    return origin


def aggregate_view(
    stream: str, config: Mapping[str, Any], states: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """``{writable, origins}`` of a bucket that sources others (None for a plain bucket);
    each origin with the lag and activity the server reports for its source."""
    sources = config.get("sources") or []
    if not sources:
        return None
    bucket = bucket_of_stream(stream) or stream
    by_identity = {source_identity(s): s for s in states or []}
    origins = []
    for source in sources:
        origin = _origin_of(source)
        state = by_identity.get(source_identity(source))
        if state is not None:
            origin["lag"] = state.get("lag", 0)
            active = state.get("active")
            if isinstance(active, int) and active >= 0:
                origin["active"] = ns_to_seconds(active)
        origins.append(origin)
    return {"writable": config.get("subjects") == [f"$KV.{bucket}.>"], "origins": origins}


def is_read_only(config: Mapping[str, Any]) -> bool:
    """A read-only aggregate: sources, and no subjects of its own."""
    return bool(config.get("sources")) and not config.get("subjects")
