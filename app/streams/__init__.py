"""Streams: create, update, inspect, purge and delete, and messages by sequence."""
