"""Publishing to streams: one message or a batch, with PubAck, de-duplication and
expected-sequence checks."""
