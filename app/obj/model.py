"""ADR-20's layout of an object bucket, and the object info (meta message) codec.

A bucket ``B`` is the stream ``OBJ_B`` on ``$O.B.C.>`` (chunks) and ``$O.B.M.>`` (meta). An
object's chunks are the messages on ``$O.B.C.<nuid>`` (a fresh NUID per version), its info
the last message on ``$O.B.M.<name as padded URL-safe base64>``, published with
``Nats-Rollup: sub`` so that only the latest stays. The digest is ``SHA-256=`` and the
padded URL-safe base64 of the SHA-256 of the content. A deleted object keeps a meta message
with ``deleted: true`` (size, chunks and digest cleared); a link is a meta message whose
``options.link`` names another object (``{bucket, name}``), and has no chunks.

These are the spellings nats-py (``nats/js/object_store.py``) and the Go client use, so that
either reads what the gateway writes and the other way round.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from app import errors
from app.errors import ErrorCode

STREAM_PREFIX = "OBJ_"
CHUNK_SIZE = 128 * 1024  # ADR-20's default chunk size
DIGEST_PREFIX = "SHA-256="
ROLLUP = {"Nats-Rollup": "sub"}
# Object names are free text (they are base64-encoded into the subject): refuse only what no
# client could mean, control characters, and names so long that the subject of a Direct Get of
# their meta message (base64 of up to 2 KiB, two bucket names) would pass nats-server's
# 4 KiB protocol line.
MAX_NAME_LENGTH = 512
NAME_SCHEMA: dict[str, Any] = {
    "pattern": "^[^\\x00-\\x1f\\x7f]+$",
    "minLength": 1,
    "maxLength": MAX_NAME_LENGTH,
}
_NAME = re.compile(r"^[^\x00-\x1f\x7f]+$")


def stream_name(bucket: str) -> str:
    return STREAM_PREFIX + bucket


def bucket_of_stream(stream: str) -> str | None:
    return stream[len(STREAM_PREFIX) :] if stream.startswith(STREAM_PREFIX) else None


def subjects(bucket: str) -> list[str]:
    return [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"]


def chunk_subject(bucket: str, nuid: str) -> str:
    return f"$O.{bucket}.C.{nuid}"


def meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{encode_name(name)}"


def all_meta(bucket: str) -> str:
    return f"$O.{bucket}.M.>"


def encode_name(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def decode_name(token: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def object_name(name: str) -> str:
    """A valid object name, or 400: 1 to 512 characters, no control characters."""
    if not name or len(name) > MAX_NAME_LENGTH or _NAME.fullmatch(name) is None:
        raise errors.InvalidInput(
            ErrorCode.OBJ_NAME_INVALID,
            f"object names are 1 to {MAX_NAME_LENGTH} characters without control characters",
        )
    return name


# A bucket is the stream OBJ_<bucket>, and stream names have at most 255 characters.
BUCKET_SCHEMA: dict[str, Any] = {
    "pattern": r"^[a-zA-Z0-9_-]{1,251}$",
    "minLength": 1,
    "maxLength": 251,
}
_BUCKET = re.compile(BUCKET_SCHEMA["pattern"])


def bucket_name(bucket: str) -> str:
    if _BUCKET.fullmatch(bucket) is None:
        raise errors.InvalidInput(
            ErrorCode.OBJ_BUCKET_INVALID,
            f"invalid object bucket name {bucket!r}: use 1-251 letters, digits, '-' or '_'",
        )
    return bucket


def digest_of(sha256: bytes) -> str:
    return DIGEST_PREFIX + base64.urlsafe_b64encode(sha256).decode()


def digest_bytes(digest: str) -> bytes | None:
    """The SHA-256 a digest names (either case of the prefix, as nats-py reads it)."""
    if digest[: len(DIGEST_PREFIX)].upper() != DIGEST_PREFIX:
        return None
    try:
        value = base64.urlsafe_b64decode(digest[len(DIGEST_PREFIX) :].encode())
    except (binascii.Error, ValueError):
        return None
    return value if len(value) == 32 else None


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stream_config(bucket: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The stream ADR-20 prescribes for a bucket, with the bucket's settings."""
    body: dict[str, Any] = {
        "name": stream_name(bucket),
        "subjects": subjects(bucket),
        "max_age": int(settings.get("ttl") or 0),  # nanoseconds
        "max_bytes": settings.get("max_bytes", -1),
        "storage": settings.get("storage", "file"),
        "num_replicas": settings.get("replicas", 1),
        "discard": "new",
        "allow_rollup_hdrs": True,
        "allow_direct": True,
        "retention": "limits",
        "max_msgs": -1,
        "max_msgs_per_subject": -1,
        "max_msg_size": -1,
        "max_consumers": -1,
        "compression": "s2" if settings.get("compression") else "none",
    }
    for name in ("description", "placement", "metadata"):
        if settings.get(name) is not None:
            body[name] = settings[name]
    return body


def is_bucket(bucket: str, config: dict[str, Any]) -> bool:
    return sorted(config.get("subjects") or []) == sorted(subjects(bucket))


@dataclass(slots=True)
class ObjectInfo:
    """An object's meta message, as ADR-20 (and nats-py, and Go) spell it."""

    bucket: str
    name: str
    nuid: str
    size: int = 0
    chunks: int = 0
    digest: str = ""
    mtime: str = ""
    deleted: bool = False
    description: str | None = None
    headers: dict[str, list[str]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    link: dict[str, str] | None = None
    max_chunk_size: int | None = None
    seq: int = 0  # the meta message's stream sequence (0: none stored yet)

    @property
    def etag(self) -> str:
        return f'"{self.digest}"'

    def wire(self) -> bytes:
        """The meta message's payload."""
        body: dict[str, Any] = {"name": self.name}
        if self.description:
            body["description"] = self.description
        if self.headers:
            body["headers"] = self.headers
        if self.metadata:
            body["metadata"] = self.metadata
        options: dict[str, Any] = {}
        if self.link is not None:
            options["link"] = self.link
        if self.max_chunk_size:
            options["max_chunk_size"] = self.max_chunk_size
        if options:
            body["options"] = options
        body.update(
            bucket=self.bucket,
            nuid=self.nuid,
            size=self.size,
            mtime=self.mtime,
            chunks=self.chunks,
        )
        if self.digest:
            body["digest"] = self.digest
        if self.deleted:
            body["deleted"] = True
        return orjson.dumps(body)

    def to_json(self) -> dict[str, Any]:
        """The ObjectInfo the API answers with."""
        out: dict[str, Any] = {
            "bucket": self.bucket,
            "name": self.name,
            "nuid": self.nuid,
            "size": self.size,
            "chunks": self.chunks,
            "digest": self.digest,
            "mtime": self.mtime,
            "description": self.description,
            "headers": self.headers,
            "metadata": self.metadata,
            "deleted": self.deleted,
        }
        if self.link is not None:
            out["link"] = self.link
        return out

    @property
    def content_type(self) -> str | None:
        values = self.headers.get("Content-Type")
        return values[0] if values else None


def parse_info(data: bytes, seq: int = 0, time: str | None = None) -> ObjectInfo:
    """A meta message's payload, whoever wrote it; 502 when it is not one."""
    try:
        raw = orjson.loads(data)
        if not isinstance(raw, dict):
            raise TypeError
        options = raw.get("options") or {}
        link = options.get("link") if isinstance(options, dict) else None
        info = ObjectInfo(
            bucket=str(raw.get("bucket") or ""),
            name=str(raw["name"]),
            nuid=str(raw.get("nuid") or ""),
            size=int(raw.get("size") or 0),
            chunks=int(raw.get("chunks") or 0),
            digest=str(raw.get("digest") or ""),
            mtime=str(raw.get("mtime") or time or ""),
            deleted=bool(raw.get("deleted")),
            description=raw.get("description") or None,
            headers=_headers(raw.get("headers")),
            metadata={str(k): str(v) for k, v in (raw.get("metadata") or {}).items()},
            link=(
                {
                    "bucket": str(link["bucket"]),
                    **({"name": str(link["name"])} if link.get("name") else {}),
                }
                if isinstance(link, dict) and link.get("bucket")
                else None
            ),
            max_chunk_size=(options.get("max_chunk_size") if isinstance(options, dict) else None),
            seq=seq,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise errors.UpstreamError(
            ErrorCode.OBJ_META_INVALID, "the object's meta message is not ADR-20 object info"
        ) from None
    if time and not info.mtime:
        info.mtime = time
    return info


def _headers(raw: Any) -> dict[str, list[str]]:
    """Go writes ``{name: [values]}``, nats-py whatever dict it was given: both come back as
    lists."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, list[str]] = {}
    for name, value in raw.items():
        out[str(name)] = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return out
