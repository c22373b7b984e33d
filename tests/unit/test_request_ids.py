"""Request ids made by the gateway: 32 hex digits, unique, also across forked workers."""

from __future__ import annotations

import os
import re

from app.middleware import new_request_id


def test_ids_are_32_hex_digits_and_unique() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_worker_makes_other_ids() -> None:
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first id and leave at once
        os.write(writer, new_request_id().encode())
        os._exit(0)
    os.close(writer)
    child = os.read(reader, 64).decode()
    os.waitpid(pid, 0)
    mine = new_request_id()
    assert len(child) == 32 and child[:20] != mine[:20]
