"""Pull consumers (ADR-37) with priority groups (ADR-42): configuration, fetch/next/consume
options, acks and unpin."""
