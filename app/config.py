"""Gateway settings, read once from the environment (prefix ``JSGW_``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

NATS_URL_SCHEMES = {"nats", "tls", "ws", "wss"}


class Settings(BaseSettings):
    """Every knob of the gateway. Bad values fail at start-up, before anything listens."""

    model_config = SettingsConfigDict(
        env_prefix="JSGW_",
        extra="ignore",
        secrets_dir=None,
        frozen=True,
    )

    # NATS connection. Unset URL: run an embedded nats-server (JetStream on, loopback only).
    nats_url: Annotated[list[str], NoDecode] = Field(default_factory=list)
    nats_creds: Path | None = None
    nats_nkey: SecretStr | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    js_domain: str | None = None

    pool_size: int = Field(default=2, ge=1, le=64)
    request_timeout: float = Field(default=5.0, gt=0, le=300)
    max_reconnect_attempts: int = Field(default=120, ge=1)
    reconnect_wait: float = Field(default=0.5, gt=0, le=60)
    # Liveness of pooled connections: a ping every interval, and a server that leaves this
    # many unanswered is taken as gone; a connection whose requests time out is pinged at
    # once, and gone when no answer comes within the probe timeout.
    nats_ping_interval: float = Field(default=2.0, ge=0.1, le=600)
    nats_max_outstanding_pings: int = Field(default=1, ge=1, le=100)
    nats_probe_timeout: float = Field(default=1.0, gt=0, le=60)
    # How long a write's refusal waits for a PubAck that contradicts it (see
    # ReplyMux.request_write): a deposed leader and the new one may both answer one publish.
    write_confirm_grace: float = Field(default=0.1, ge=0, le=10)

    # HTTPS serving; with a client CA, client certificates can authenticate (optional).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    # Clients that hold a connection without finishing a request (app.serving): a request
    # head (request line and headers) must be complete this long after the connection opened
    # or after its first byte arrived; a keep-alive connection idle this long is closed. Once
    # a head is complete nothing here bounds the request: streams and slow bodies go on.
    header_timeout: float = Field(default=20.0, gt=0, le=3600)
    # The size of a request head (request line and header lines) and its number of header
    # fields: past either, 431 and the connection closed, before anything else looks at it.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_header_fields: int = Field(default=100, ge=8, le=10_000)
    keep_alive_timeout: float = Field(default=5.0, gt=0, le=3600)
    # Open connections per worker (also kept below the descriptor limit): a connection past
    # it is answered 503 with Retry-After and closed.
    max_connections: int = Field(default=10_000, ge=1)
    log_level: str = "info"
    access_log: bool = True
    # The lean paths (app.fastpath) of the hottest requests and of KV watches; off, FastAPI
    # serves them.
    lean_paths: bool = True
    # FastAPI's native OpenTelemetry instrumentation (needs an OpenTelemetry SDK configured in
    # the process). Off, it costs nothing; on, its checks run on every request.
    otel: bool = False

    ack_secret: SecretStr | None = None
    auth_file: Path | None = None
    allow_unauthenticated: bool = False
    rate_limit: float = Field(default=0.0, ge=0, description="requests/s per token; 0: off")
    rate_burst: int = Field(default=0, ge=0)
    sse_token_ttl: float = Field(default=300.0, gt=0, le=86_400)
    # Open SSE streams per worker: in all, per token, and per anonymous client address. One
    # client's cap is half the worker's: 2,000 watchers from one address (a sidecar's
    # application, a proxy not listed below) fit, and no one client takes the whole worker.
    sse_max_streams: int = Field(default=5000, ge=1, description="open SSE streams per worker")
    sse_max_per_token: int = Field(default=2500, ge=1, description="open SSE streams per token")
    sse_max_per_address: int = Field(
        default=2500, ge=1, description="open anonymous SSE streams per client address"
    )
    # Proxies whose forwarding header (X-Forwarded-For, or RFC 7239 Forwarded) names the
    # client of a request (app.clients): IP addresses or CIDR ranges; empty, none is.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    proxy_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_dir: Path = Path("./data")

    max_body: int = Field(default=16 * 1024 * 1024, ge=1024)
    # JSON bodies (stream and consumer configs, batch publishes, multi reads): decoded and
    # validated on the event loop, so bounded well below the raw bodies of JSGW_MAX_BODY.
    max_json_body: int = Field(default=1024 * 1024, ge=1024)
    max_publish_batch: int = Field(default=1000, ge=1, le=100_000)
    max_direct_batch: int = Field(default=100_000, ge=1)
    max_multi_subjects: int = Field(default=100_000, ge=1)
    # Pull consumers: caps on one fetch (messages are held in memory until answered), on how
    # long a pull may wait, and the SSE keep-alive comment interval.
    max_fetch_messages: int = Field(default=1000, ge=1, le=100_000)
    max_fetch_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_fetch_expires: float = Field(default=300.0, ge=1, le=3600)
    sse_heartbeat: float = Field(default=15.0, gt=0, le=300)
    # KV watches: events queued per SSE client before it is cut off as too slow, the idle
    # heartbeat of the NATS consumer behind each watch (two missed: it is re-created), and
    # how many watches the gateway serves at once.
    sse_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
    kv_watch_heartbeat: float = Field(default=5.0, ge=0.1, le=60)
    kv_max_watches: int = Field(default=10_000, ge=1)
    # Opt-in read cache (app.kv.cache): buckets whose latest values are kept in
    # memory, fed by a watch of each; a bucket whose values outgrow the cap is not cached.
    kv_cache: Annotated[list[str], NoDecode] = Field(default_factory=list)
    kv_cache_max_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # Core NATS over HTTP (app.corenats): the longest a request may wait for its reply, and
    # the bytes queued for one subscribe stream (besides JSGW_SSE_QUEUE_SIZE messages) before
    # its client is cut off as a slow consumer.
    nats_request_max_timeout: float = Field(default=30.0, gt=0, le=300)
    nats_subscribe_queue_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    retry_after: int = Field(default=1, ge=1, le=3600)
    # Push delivery (app.push): the URL prefixes subscriptions may POST to (the pod's own
    # application by default), subscriptions declared in a file, the bucket that holds those
    # made through the API, and how long POSTs under way may finish when the gateway stops.
    push_allowed_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1", "http://localhost"]
    )
    subscriptions: Path | None = None
    subscriptions_bucket: str = "jsgw_subscriptions"
    push_shutdown_grace: float = Field(default=5.0, ge=0, le=300)
    # The CA certificates (PEM) that https:// endpoints' certificates are verified against,
    # instead of the system's (an application with a certificate of a private CA).
    push_ca: Path | None = None

    @field_validator(
        "nats_url",
        "cors_origins",
        "kv_cache",
        "trusted_proxies",
        "push_allowed_urls",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("nats_url")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            if parts.scheme not in NATS_URL_SCHEMES or not parts.hostname:
                raise ValueError(f"not a NATS server URL: {url!r} (expected nats://host:port)")
        return urls

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, values: list[str]) -> list[str]:
        from app.clients import parse_networks

        return [str(network) for network in parse_networks(values)]

    @field_validator("proxy_header", mode="before")
    @classmethod
    def _lower_header(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("kv_cache")
    @classmethod
    def _check_buckets(cls, buckets: list[str]) -> list[str]:
        from app.validation import is_name_token

        for bucket in buckets:
            if not is_name_token(bucket):
                raise ValueError(f"not a bucket name: {bucket!r}")
        return buckets

    @field_validator("push_allowed_urls")
    @classmethod
    def _check_prefixes(cls, prefixes: list[str]) -> list[str]:
        from app.push.allowlist import DEFAULT_ALLOWED, EndpointError, parse_prefix

        if tuple(prefixes) == DEFAULT_ALLOWED:
            return prefixes  # (parsed on first use: see app.push.allowlist.http_url)
        for prefix in prefixes:
            try:
                parse_prefix(prefix)
            except EndpointError as exc:
                raise ValueError(f"{prefix!r}: {exc}") from None
        return prefixes

    @field_validator("subscriptions_bucket")
    @classmethod
    def _check_subscriptions_bucket(cls, bucket: str) -> str:
        from app.validation import is_name_token

        if not is_name_token(bucket) or len(bucket) > 252:
            raise ValueError(f"not a bucket name: {bucket!r}")
        return bucket

    @field_validator("subscriptions")
    @classmethod
    def _subscriptions_load(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        from app.push.allowlist import Allowlist
        from app.push.declared import load

        allowed = info.data.get("push_allowed_urls")
        if path is not None and allowed is not None:
            # Raises SubscriptionsFileError (a ValueError) naming the entry and the problem.
            load(path, Allowlist(allowed))
        return path

    @field_validator("js_domain")
    @classmethod
    def _check_domain(cls, domain: str | None) -> str | None:
        # The domain is spliced into every JetStream API subject: one plain token only.
        from app.validation import is_name_token

        if domain is not None and not is_name_token(domain):
            raise ValueError("JSGW_JS_DOMAIN must be one token of letters, digits, '-' or '_'")
        return domain or None

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, level: str) -> str:
        level = level.lower()
        if level not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError("JSGW_LOG_LEVEL must be one of critical, error, warning, info, debug")
        return level

    @field_validator(
        "nats_creds",
        "nats_tls_ca",
        "nats_tls_cert",
        "nats_tls_key",
        "auth_file",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "subscriptions",
        "push_ca",
    )
    @classmethod
    def _file_exists(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"file not found: {path}")
        return path

    @field_validator("auth_file")
    @classmethod
    def _auth_file_loads(cls, path: Path | None) -> Path | None:
        from app.auth.policy import load

        if path is not None:
            # Raises PolicyError (a ValueError) naming the problem; the warnings about rules
            # without effect come when the gateway loads it.
            load(path, warn=False)
        return path

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if (self.nats_tls_cert is None) != (self.nats_tls_key is None):
            raise ValueError("JSGW_NATS_TLS_CERT and JSGW_NATS_TLS_KEY go together")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("JSGW_TLS_CERT and JSGW_TLS_KEY go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("JSGW_TLS_CLIENT_CA needs JSGW_TLS_CERT and JSGW_TLS_KEY (HTTPS)")
        methods = [
            name
            for name, set_ in (
                ("creds", self.nats_creds is not None),
                ("nkey", self.nats_nkey is not None),
                ("user/password", self.nats_user is not None),
                ("token", self.nats_token is not None),
            )
            if set_
        ]
        if len(methods) > 1:
            raise ValueError(f"choose one NATS auth method, got: {', '.join(methods)}")
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("JSGW_NATS_USER and JSGW_NATS_PASSWORD go together")
        if self.workers > 1 and self.ack_secret is None:
            raise ValueError(
                "JSGW_ACK_SECRET is required with JSGW_WORKERS > 1, "
                "so that every worker verifies the ack tokens of the others"
            )
        if (
            not self.listens_on_loopback
            and self.auth_file is None
            and not self.allow_unauthenticated
        ):
            raise ValueError(
                f"JSGW_HOST={self.host} without JSGW_AUTH_FILE would open JetStream to anyone "
                "who reaches the port: set JSGW_AUTH_FILE, or JSGW_ALLOW_UNAUTHENTICATED=true "
                "if something in front of the gateway authenticates"
            )
        if not self.nats_url and methods:
            raise ValueError("NATS credentials were given without JSGW_NATS_URL")
        return self

    @property
    def embedded(self) -> bool:
        """True when the gateway runs its own nats-server."""
        return not self.nats_url

    @property
    def listens_on_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"
