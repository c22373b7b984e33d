"""KV reads never go backwards through one gateway: a Direct Get answered behind the key's
floor is read again from the stream leader.

A replica behind the others is made for real with one nats-server: a mirror of the bucket's
stream takes part in its Direct Gets (nats-server turns ``mirror_direct`` on for a mirror of a
stream with ``allow_direct``: the stream and its mirrors answer as one queue group), and a
mirror limited to 3 messages that discards new ones stops at revision 3 while the bucket goes
on. About every other Direct Get of the bucket is then answered by the stalled mirror;
tests/faults/test_cluster_kv.py has the real replica catching up after a restart.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import nats
import orjson
from nats.aio.msg import Msg

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, running_gateway
from tests.integration.test_kv_buckets import make_bucket
from tests.integration.test_kv_entries import JSON_ACCEPT, put

BOTH_PATHS = True  # every test with the gateway fixture runs with JSGW_LEAN_PATHS on and off

STALE_READS = re.compile(r"^jsgw_kv_stale_reads_total (\S+)$", re.MULTILINE)
READS = 40  # a stale answer is missed by them all with a chance of 2^-40


async def stale_reads(gateway: httpx.AsyncClient) -> float:
    found = STALE_READS.search((await gateway.get("/metrics")).text)
    assert found is not None
    return float(found.group(1))


async def stalled_mirror(nc: nats.NATS, bucket: str, at: int, stream: str = "") -> str:
    """A mirror of the bucket's stream (``stream``; ``KV_<bucket>`` when not given) that holds
    its first ``at`` messages and no more, and answers the stream's Direct Gets along with it;
    returns its name."""
    mirror = f"M_{bucket}"
    config = {
        "name": mirror,
        "mirror": {"name": stream or f"KV_{bucket}"},
        "max_msgs": at,
        "discard": "new",
        "storage": "memory",
        "allow_direct": True,
        # (An object's metadata is a roll-up: before 2.14 a mirror that does not allow them
        # stops at the first.)
        "allow_rollup_hdrs": True,
    }
    reply = await nc.request(f"$JS.API.STREAM.CREATE.{mirror}", orjson.dumps(config), timeout=2)
    assert "error" not in orjson.loads(reply.data), reply.data
    for _ in range(200):
        reply = await nc.request(f"$JS.API.STREAM.INFO.{mirror}", b"", timeout=2)
        if orjson.loads(reply.data)["state"]["last_seq"] == at:
            return mirror
        await asyncio.sleep(0.02)
    raise AssertionError(f"the mirror did not reach revision {at}")


async def direct_answers(nc: nats.NATS, bucket: str, key: str) -> set[int]:
    """The revisions that READS Direct Gets of the key got, straight from NATS."""
    subject = f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}"
    replies = [await nc.request(subject, b"", timeout=2) for _ in range(READS)]
    return {int((reply.headers or {})["Nats-Sequence"]) for reply in replies}


async def test_a_read_never_answers_behind_a_revision_written_or_served(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=10)
    url = f"/v1/kv/{name}/keys/k"
    for value in (b"1", b"2", b"3"):
        await put(gateway, name, "k", value)
    await stalled_mirror(nc, name, at=3)
    assert await put(gateway, name, "k", b"4") == 4  # written through this gateway
    assert await direct_answers(nc, name, "k") == {3, 4}  # the setup: one answer is behind
    before = await stale_reads(gateway)

    for _ in range(READS):
        read = await gateway.get(url)
        assert read.status_code == 200 and read.headers["kv-revision"] == "4", read.headers
        assert read.content == b"4"
    caught = await stale_reads(gateway) - before
    assert 0 < caught < READS

    # A revision written by someone else: once a read has answered it, none answers older.
    ack = await nc.jetstream().publish(f"$KV.{name}.k", b"5")
    assert ack.seq == 5
    revisions = []
    for _ in range(2 * READS):
        revisions.append(int((await gateway.get(url)).headers["kv-revision"]))
    assert 5 in revisions, revisions
    after_first = revisions[revisions.index(5) :]
    assert set(after_first) == {5}, revisions

    # Reads of a revision are answered as they are.
    old = await gateway.get(url, params={"revision": "2"}, headers=JSON_ACCEPT)
    assert old.status_code == 200 and old.json()["revision"] == 2


async def test_a_read_never_answers_an_older_value_after_a_newer_delete(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=10)
    url = f"/v1/kv/{name}/keys/k"
    for value in (b"1", b"2", b"3"):
        await put(gateway, name, "k", value)
    await stalled_mirror(nc, name, at=3)
    deleted = await gateway.delete(url)
    assert deleted.status_code == 204
    assert await direct_answers(nc, name, "k") == {3, 4}

    for _ in range(READS):
        gone = problem(await gateway.get(url), 404, "kv.key_not_found")
        assert gone["revision"] == 4 and gone["operation"] == "DEL", gone


async def test_if_match_any_finds_the_value_written_after_a_delete(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """``If-Match: *`` reads the key's value as GET does: a replica still at the delete
    would have it refused."""
    await make_bucket(gateway, name, history=10)
    url = f"/v1/kv/{name}/keys/k"
    await put(gateway, name, "k", b"1")
    await put(gateway, name, "k", b"2")
    assert (await gateway.delete(url)).status_code == 204
    await stalled_mirror(nc, name, at=3)
    assert await put(gateway, name, "k", b"4") == 4
    assert await direct_answers(nc, name, "k") == {3, 4}

    for revision in range(5, 5 + READS // 2):
        assert await put(gateway, name, "k", b"x", **{"If-Match": "*"}) == revision


async def test_the_leaders_answer_stands_when_the_key_went_back(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A key whose messages were removed by other means than the KV API (here a purge of the
    stream) is read as the leader has it: its floor comes down, once."""
    await make_bucket(gateway, name, history=10)
    url = f"/v1/kv/{name}/keys/k"
    await put(gateway, name, "k", b"1")
    await put(gateway, name, "k", b"2")
    purge = {"filter": f"$KV.{name}.k", "keep": 1}
    reply = await nc.request(f"$JS.API.STREAM.PURGE.KV_{name}", orjson.dumps(purge), timeout=2)
    assert orjson.loads(reply.data)["success"], reply.data
    assert (await gateway.get(url)).headers["kv-revision"] == "2"  # kept: nothing went back

    reply = await nc.request(f"$JS.API.STREAM.PURGE.KV_{name}", b"", timeout=2)
    assert orjson.loads(reply.data)["success"], reply.data
    await nc.jetstream().publish(f"$KV.{name}.other", b"o")  # revision 3
    before = await stale_reads(gateway)
    problem(await gateway.get(url), 404, "kv.key_not_found")  # the leader has no message
    problem(await gateway.get(url), 404, "kv.key_not_found")
    assert await stale_reads(gateway) - before == 1  # the floor came down with the first
    assert await put(gateway, name, "k", b"4") == 4
    assert (await gateway.get(url)).content == b"4"


async def test_a_read_asked_again_of_the_leader_answers_within_the_request_timeout(
    nats_server: EmbeddedServer, nc: nats.NATS, name: str
) -> None:
    """A Direct Get answered late and behind the key's floor is read again from the stream
    leader in what is left of the request timeout, not in a timeout of its own: the client
    has its answer (here a 504, the leader being silent) within the time it was told.

    JetStream's part is played by core-NATS responders under a JetStream domain of their
    own (which the server does not answer), so that the replica can be made slow: the first
    read is answered at revision 5 at once, the next ones at revision 4 after DELAY s.
    """
    timeout, delay = 1.0, 0.6
    stream, subject = f"KV_{name}", f"$KV.{name}.k"
    revisions = iter([5])

    async def replica(msg: Msg) -> None:
        revision = next(revisions, 4)
        if revision == 4:
            await asyncio.sleep(delay)
        headers = {
            "Nats-Stream": stream,
            "Nats-Subject": subject,
            "Nats-Sequence": str(revision),
            "Nats-Time-Stamp": "2026-11-27T00:00:00.000000000Z",
        }
        await nc.publish(msg.reply, str(revision).encode(), headers=headers)

    async def silent(msg: Msg) -> None:
        asked.set()

    asked = asyncio.Event()
    await nc.subscribe(f"$JS.scripted.API.DIRECT.GET.{stream}.{subject}", cb=replica)
    await nc.subscribe(f"$JS.scripted.API.STREAM.MSG.GET.{stream}", cb=silent)
    await nc.flush()
    settings = gateway_settings(nats_server.url, js_domain="scripted", request_timeout=timeout)
    async with running_gateway(settings) as gateway:
        url = f"/v1/kv/{name}/keys/k"
        first = await gateway.get(url)
        assert first.status_code == 200 and first.headers["kv-revision"] == "5", first.text
        started = time.monotonic()
        late = await gateway.get(url)
        took = time.monotonic() - started
    problem(late, 504, "nats.timeout")
    assert asked.is_set()  # the leader was asked
    # One request timeout in all (before, DELAY + one more: 1.6 s).
    assert took < timeout + 0.3, took
