"""Objects read through the gateway that wrote them are found, whole, even when a server
behind the write answers the reads: an object's info answered behind what this process wrote
or served is read again from the stream leader, and chunks a lagging server lacks are asked
of the leader.

The lagging server is a stalled mirror of the bucket's stream, which answers its Direct Gets
along with it (as in tests/integration/test_kv_monotonic.py); in a cluster it is a replica
that has not applied the write yet.
"""

from __future__ import annotations

import httpx
import nats

from app.obj.model import meta_subject
from tests.integration.test_kv_monotonic import READS, stalled_mirror
from tests.integration.test_obj import CHUNK, digest, make_bucket


async def direct_found(nc: nats.NATS, stream: str, subject: str) -> set[bool]:
    """Whether each of READS Direct Gets of the subject's last message found one."""
    found = set()
    for _ in range(READS):
        reply = await nc.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=2)
        found.add((reply.headers or {}).get("Status") != "404")
    return found


async def direct_seqs(nc: nats.NATS, stream: str, subject: str) -> set[str]:
    """The sequences READS Direct Gets of the subject's last message answered with."""
    seqs = set()
    for _ in range(READS):
        reply = await nc.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=2)
        seqs.add((reply.headers or {}).get("Nats-Sequence", ""))
    return seqs


def content(tag: bytes) -> bytes:
    """Four chunks' worth (the last one short), every byte telling its place."""
    return (tag + bytes(range(255))) * (3 * CHUNK // 256) + tag * 100


async def test_objects_just_stored_are_read_whole(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name)
    bodies = {"first": b"a" * 10, "second": content(b"b")}
    for key, body in bodies.items():  # seqs 1-2 (a chunk, its meta), 3-7 (four chunks, meta)
        stored = await gateway.put(f"/v1/obj/{name}/objects/{key}", content=body)
        assert stored.status_code == 201, stored.text
    # It holds "first" and two of "second"'s four chunks, and none of "third".
    await stalled_mirror(nc, name, at=4, stream=f"OBJ_{name}")
    bodies["third"] = content(b"c")
    stored = await gateway.put(f"/v1/obj/{name}/objects/third", content=bodies["third"])
    assert stored.status_code == 201, stored.text
    # The setup: about every other Direct Get of the new objects' infos finds none.
    for key in ("second", "third"):
        assert await direct_found(nc, f"OBJ_{name}", meta_subject(name, key)) == {True, False}

    start, end = 2 * CHUNK + 5, 3 * CHUNK + 10  # across the third and fourth chunks
    for _ in range(READS):
        for key, body in bodies.items():
            info = await gateway.get(f"/v1/obj/{name}/info/{key}")
            assert info.status_code == 200, info.text
            got = await gateway.get(f"/v1/obj/{name}/objects/{key}")
            assert got.status_code == 200 and got.content == body, (key, got.status_code)
        for key in ("second", "third"):
            part = await gateway.get(
                f"/v1/obj/{name}/objects/{key}", headers={"Range": f"bytes={start}-{end}"}
            )
            assert part.status_code == 206, (key, part.text)
            assert part.content == bodies[key][start : end + 1], key
    deleted = await gateway.delete(f"/v1/obj/{name}/objects/first")
    assert deleted.status_code == 204, deleted.text
    for _ in range(READS):  # the deletion is not undone by the mirror's older info
        assert (await gateway.get(f"/v1/obj/{name}/info/first")).status_code == 404


OTHERS = 10  # each write below that a stale info would spoil is spoilt with a chance of 1/2


async def test_writes_replace_what_the_leader_has_not_a_lagging_copy(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Objects another client wrote while a server lags: the gateway's writes check and
    replace the version the stream leader has (a right If-Match is not refused, a delete
    purges the chunks of the version it deletes, If-None-Match finds the object)."""
    await make_bucket(gateway, name)
    store = await nc.jetstream().object_store(name)
    for i in range(2 * OTHERS):  # a chunk and a meta message each: seqs 1 to 4 * OTHERS
        await store.put(f"o{i}", b"v1")
    await stalled_mirror(nc, name, at=4 * OTHERS, stream=f"OBJ_{name}")
    for i in range(2 * OTHERS):
        await store.put(f"o{i}", b"v2")  # nats-py purges v1's chunk
    await store.put("new", b"n")  # which the mirror lacks
    for i in range(OTHERS):
        await store.put(f"fresh{i}", b"f")  # and these
    # The setup: about every other Direct Get of an info answers v1's.
    assert len(await direct_seqs(nc, f"OBJ_{name}", meta_subject(name, "o0"))) == 2
    v2 = f'"{digest(b"v2")}"'

    for i in range(OTHERS):
        replaced = await gateway.put(
            f"/v1/obj/{name}/objects/o{i}", content=b"v3", headers={"If-Match": v2}
        )
        assert replaced.status_code == 200, (i, replaced.text)
    for i in range(OTHERS, 2 * OTHERS):
        assert (await gateway.delete(f"/v1/obj/{name}/objects/o{i}")).status_code == 204
    for i in range(OTHERS):  # replaced, not created, whichever server answered the check
        stored = await gateway.put(f"/v1/obj/{name}/objects/fresh{i}", content=b"g")
        assert stored.status_code == 200, (i, stored.status_code, stored.text)
    for _ in range(OTHERS):  # refused as existing, whichever server answered the check
        created = await gateway.put(
            f"/v1/obj/{name}/objects/new", content=b"x", headers={"If-None-Match": "*"}
        )
        assert created.status_code == 412 and created.json()["code"] == "obj.exists", created.text
    js = nc.jetstream()
    left = (await js.stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")).state
    # One chunk (v3's) for each object replaced, none for those deleted, "new"'s own, and
    # one for each "fresh" object (its new version's: the replaced one's purged).
    assert sum((left.subjects or {}).values()) == 2 * OTHERS + 1, left.subjects
