"""jsgw: an HTTP/REST + SSE gateway for NATS JetStream."""

__version__ = "0.1.0"
