"""Objects read through the gateway that wrote them are found, whole, even when a server
behind the write answers the reads: an object's info answered behind what this process wrote
or served is read again from the stream leader, and chunks a lagging server lacks are asked
of the leader.

The lagging server is a stalled mirror of the bucket's stream, which answers its Direct Gets
along with it (as in tests/integration/test_kv_monotonic.py); in a cluster it is a replica
that has not applied the write yet.
"""

from __future__ import annotations

import hashlib

import httpx
import nats

from tests.integration.test_kv_monotonic import READS, stalled_mirror
from tests.integration.test_obj import CHUNK, make_bucket


async def direct_found(nc: nats.NATS, stream: str, subject: str) -> set[bool]:
    """Whether each of READS Direct Gets of the subject's last message found one."""
    found = set()
    for _ in range(READS):
        reply = await nc.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=2)
        found.add((reply.headers or {}).get("Status") != "404")
    return found


async def test_an_object_just_stored_is_read_whole(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name)
    first = b"a" * 10
    assert (await gateway.put(f"/v1/obj/{name}/objects/first", content=first)).status_code == 201
    await stalled_mirror(nc, name, at=2, stream=f"OBJ_{name}")  # its chunk and meta only
    body = bytes(range(256)) * (3 * CHUNK // 256) + b"tail"  # four chunks
    stored = await gateway.put(f"/v1/obj/{name}/objects/second", content=body)
    assert stored.status_code == 201, stored.text
    # The setup: about every other Direct Get of the new object's info finds none.
    assert await direct_found(nc, f"OBJ_{name}", f"$O.{name}.M.c2Vjb25k") == {True, False}

    for _ in range(READS):
        info = await gateway.get(f"/v1/obj/{name}/info/second")
        assert info.status_code == 200, info.text
        got = await gateway.get(f"/v1/obj/{name}/objects/second")
        assert got.status_code == 200, got.text
        assert hashlib.sha256(got.content).digest() == hashlib.sha256(body).digest()
    deleted = await gateway.delete(f"/v1/obj/{name}/objects/first")
    assert deleted.status_code == 204, deleted.text
    for _ in range(READS):  # the deletion is not undone by the mirror's older info
        assert (await gateway.get(f"/v1/obj/{name}/info/first")).status_code == 404
