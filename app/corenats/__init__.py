"""Core NATS over HTTP: publish, request/reply and subscribe, outside JetStream."""
