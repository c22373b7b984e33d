"""Object buckets (ADR-20): chunked objects in a stream, as nats-py and the nats CLI keep them."""
