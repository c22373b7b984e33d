"""Counters (ADR-49): increments of a subject's value in a stream with ``allow_msg_counter``,
and reads of the values, one or many at one point in time."""
