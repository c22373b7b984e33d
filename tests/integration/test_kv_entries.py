"""KV entries against a real nats-server: reads, conditional writes, deletes, history, TTLs."""

from __future__ import annotations

import asyncio
import base64
import itertools

import httpx
import nats
import orjson
import pytest

from tests.helpers import problem
from tests.integration.test_kv_buckets import make_bucket

BOTH_PATHS = True  # every test with the gateway fixture runs with JSGW_LEAN_PATHS on and off

JSON_ACCEPT = {"Accept": "application/json"}


async def stored(nc: nats.NATS, bucket: str) -> tuple[int, int]:
    """(messages, last sequence) of the bucket's stream."""
    reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", b"", timeout=2)
    state = orjson.loads(reply.data)["state"]
    return state["messages"], state["last_seq"]


async def put(gw: httpx.AsyncClient, bucket: str, key: str, value: bytes, **headers: str) -> int:
    response = await gw.put(f"/v1/kv/{bucket}/keys/{key}", content=value, headers=headers)
    assert response.status_code in (200, 201), response.text
    return response.json()["revision"]


async def test_put_then_get_raw_json_and_head(gateway: httpx.AsyncClient, name: str) -> None:
    await make_bucket(gateway, name, history=3)
    written = await gateway.put(f"/v1/kv/{name}/keys/app/conf=1.x_y-z", content=b"\x00\xffbin")
    assert written.status_code == 200
    assert written.json() == {"revision": 1}
    assert written.headers["etag"] == '"1"'

    raw = await gateway.get(f"/v1/kv/{name}/keys/app/conf=1.x_y-z")
    assert raw.status_code == 200 and raw.content == b"\x00\xffbin"
    assert raw.headers["content-type"] == "application/octet-stream"
    assert raw.headers["etag"] == '"1"' and raw.headers["kv-revision"] == "1"
    assert raw.headers["kv-operation"] == "PUT" and raw.headers["kv-created"].endswith("Z")

    entry = (await gateway.get(f"/v1/kv/{name}/keys/app/conf=1.x_y-z", headers=JSON_ACCEPT)).json()
    assert entry == {
        "bucket": name,
        "key": "app/conf=1.x_y-z",
        "value": base64.b64encode(b"\x00\xffbin").decode(),
        "revision": 1,
        "created": raw.headers["kv-created"],
        "delta": 0,
        "operation": "PUT",
    }

    head = await gateway.head(f"/v1/kv/{name}/keys/app/conf=1.x_y-z")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["etag"] == '"1"' and head.headers["content-length"] == "5"
    problem(await gateway.get(f"/v1/kv/{name}/keys/missing"), 404, "kv.key_not_found")
    assert (await gateway.head(f"/v1/kv/{name}/keys/missing")).status_code == 404


async def test_conditional_get(gateway: httpx.AsyncClient, name: str) -> None:
    await make_bucket(gateway, name)
    await put(gateway, name, "k", b"one")
    unchanged = await gateway.get(f"/v1/kv/{name}/keys/k", headers={"If-None-Match": '"1"'})
    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged.headers["etag"] == '"1"'
    assert (
        await gateway.head(f"/v1/kv/{name}/keys/k", headers={"If-None-Match": "*"})
    ).status_code == 304
    await put(gateway, name, "k", b"two")
    changed = await gateway.get(f"/v1/kv/{name}/keys/k", headers={"If-None-Match": '"1"'})
    assert changed.status_code == 200 and changed.content == b"two"
    assert changed.headers["etag"] == '"2"'


async def test_create_succeeds_only_over_nothing_or_a_delete(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=5)
    url = f"/v1/kv/{name}/keys/k"
    created = await gateway.put(url, content=b"v1", headers={"If-None-Match": "*"})
    assert created.status_code == 201 and created.json() == {"revision": 1}
    assert created.headers["location"] == url

    exists = problem(
        await gateway.put(url, content=b"v2", headers={"If-None-Match": "*"}), 412, "kv.key_exists"
    )
    assert exists["revision"] == 1

    assert (await gateway.delete(url)).status_code == 204  # revision 2: a DEL marker
    again = await gateway.put(url, content=b"v3", headers={"If-None-Match": "*"})
    assert again.status_code == 201 and again.json() == {"revision": 3}

    assert (await gateway.delete(url, params={"purge": "true"})).status_code == 204  # rev 4
    after_purge = await gateway.put(url, content=b"v5", headers={"If-None-Match": "*"})
    assert after_purge.status_code == 201 and after_purge.json() == {"revision": 5}
    assert (await gateway.get(url)).content == b"v5"
    assert await stored(nc, name) == (2, 5)  # purge marker + v5: the purge dropped the rest


async def test_update_with_if_match(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    await make_bucket(gateway, name, history=5)
    url = f"/v1/kv/{name}/keys/k"
    await put(gateway, name, "k", b"a")
    updated = await gateway.put(url, content=b"b", headers={"If-Match": '"1"'})
    assert updated.status_code == 200 and updated.json() == {"revision": 2}

    stale = problem(
        await gateway.put(url, content=b"c", headers={"If-Match": '"1"'}),
        412,
        "kv.revision_mismatch",
    )
    assert stale["revision"] == 2 and stale["operation"] == "PUT"
    missing = problem(
        await gateway.put(f"/v1/kv/{name}/keys/nope", content=b"c", headers={"If-Match": '"2"'}),
        412,
        "kv.revision_mismatch",
    )
    assert missing["revision"] == 0
    assert await stored(nc, name) == (2, 2)

    # If-Match: * needs a current value; a deleted key has none.
    assert (await gateway.put(url, content=b"d", headers={"If-Match": "*"})).json() == {
        "revision": 3
    }
    await gateway.delete(url, headers={"If-Match": '"3"'})
    deleted = problem(
        await gateway.put(url, content=b"e", headers={"If-Match": "*"}), 412, "kv.revision_mismatch"
    )
    assert deleted == deleted | {"revision": 4, "operation": "DEL"}
    problem(await gateway.delete(url, headers={"If-Match": '"3"'}), 412, "kv.revision_mismatch")


async def test_delete_keeps_history_and_purge_drops_it(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name, history=10)
    for value in (b"1", b"2"):
        await put(gateway, name, "k", value)
    deleted = await gateway.delete(f"/v1/kv/{name}/keys/k")
    assert deleted.status_code == 204 and deleted.headers["kv-revision"] == "3"
    gone = problem(await gateway.get(f"/v1/kv/{name}/keys/k"), 404, "kv.key_not_found")
    assert gone["revision"] == 3 and gone["operation"] == "DEL"

    history = (await gateway.get(f"/v1/kv/{name}/history/k")).json()["entries"]
    assert [(e["revision"], e["operation"], e["delta"]) for e in history] == [
        (1, "PUT", 2),
        (2, "PUT", 1),
        (3, "DEL", 0),
    ]
    assert [base64.b64decode(e["value"]) for e in history] == [b"1", b"2", b""]

    await put(gateway, name, "k", b"4")
    assert (await gateway.delete(f"/v1/kv/{name}/keys/k?purge=true")).headers["kv-revision"] == "5"
    history = (await gateway.get(f"/v1/kv/{name}/history/k")).json()["entries"]
    assert [(e["revision"], e["operation"]) for e in history] == [(5, "PURGE")]
    marker = await nc.request(f"$JS.API.DIRECT.GET.KV_{name}.$KV.{name}.k", b"", timeout=2)
    assert marker.headers["KV-Operation"] == "PURGE" and marker.headers["Nats-Rollup"] == "sub"
    problem(await gateway.get(f"/v1/kv/{name}/history/never"), 404, "kv.key_not_found")


async def test_a_revision_of_another_key_is_not_found(
    gateway: httpx.AsyncClient, name: str
) -> None:
    await make_bucket(gateway, name, history=5)
    await put(gateway, name, "secret", b"s3cr3t")  # revision 1
    await put(gateway, name, "public", b"hello")  # revision 2
    problem(await gateway.get(f"/v1/kv/{name}/keys/public?revision=1"), 404, "kv.key_not_found")
    problem(await gateway.get(f"/v1/kv/{name}/keys/public?revision=99"), 404, "kv.key_not_found")
    assert (await gateway.get(f"/v1/kv/{name}/keys/public?revision=2")).content == b"hello"
    # Wildcards are refused before NATS sees them: never "the last message of any key".
    for key in ("*", ">", "s*", "secret.*", "%2A", "%3E"):
        body = problem(await gateway.get(f"/v1/kv/{name}/keys/{key}"), 400, "kv.key_invalid")
        assert "s3cr3t" not in str(body)
        problem(await gateway.get(f"/v1/kv/{name}/history/{key}"), 400, "kv.key_invalid")
    for bad in ("0", "-1", "x", str(2**64)):
        problem(await gateway.get(f"/v1/kv/{name}/keys/public?revision={bad}"), 400)


async def test_seed_users_bucket_read_back_at_every_revision(
    gateway: httpx.AsyncClient, nc: nats.NATS
) -> None:
    """ADR-31's example: USERS, 1234.name / surname / address, the address written twice."""
    bucket = "USERS"
    await make_bucket(gateway, bucket, history=5)
    try:
        writes = [
            ("1234.name", b"Bob"),
            ("1234.surname", b"Smith"),
            ("1234.address", b"1 Main Street"),
            ("1234.address", b"10 Oak Lane"),
        ]
        for expected, (key, value) in enumerate(writes, start=1):
            assert await put(gateway, bucket, key, value) == expected
        kv = await nc.jetstream().key_value(bucket)
        for revision, (written_key, value) in enumerate(writes, start=1):
            for key in ("1234.name", "1234.surname", "1234.address"):
                url = f"/v1/kv/{bucket}/keys/{key}?revision={revision}"
                response = await gateway.get(url, headers=JSON_ACCEPT)
                if key != written_key:
                    problem(response, 404, "kv.key_not_found")
                    continue
                entry = response.json()
                assert base64.b64decode(entry["value"]) == value
                assert entry["revision"] == revision and entry["key"] == key
                # nats-py reads the same revision the same way.
                assert (await kv.get(key, revision=revision)).value == value
        address = (
            await gateway.get(f"/v1/kv/{bucket}/keys/1234.address?revision=3", headers=JSON_ACCEPT)
        ).json()
        assert address["delta"] == 1  # one newer revision of this key
        latest = await gateway.get(f"/v1/kv/{bucket}/keys/1234.address")
        assert latest.content == b"10 Oak Lane" and latest.headers["etag"] == '"4"'
        history = (await gateway.get(f"/v1/kv/{bucket}/history/1234.address")).json()["entries"]
        assert [(e["revision"], base64.b64decode(e["value"])) for e in history] == [
            (3, b"1 Main Street"),
            (4, b"10 Oak Lane"),
        ]
        keys = (await gateway.get(f"/v1/kv/{bucket}/keys", params={"filter": "1234.>"})).json()
        assert sorted(keys["keys"]) == ["1234.address", "1234.name", "1234.surname"]
    finally:
        await gateway.delete(f"/v1/kv/{bucket}")


async def test_concurrent_if_match_updates_lose_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A counter incremented by many clients with read/If-Match/retry: one winner per revision."""
    await make_bucket(gateway, name, history=64)
    url = f"/v1/kv/{name}/keys/counter"
    first = await put(gateway, name, "counter", b"0")
    clients, increments = 12, 4
    wins: list[tuple[int, int]] = []  # (revision read, revision written)
    conflicts = 0

    async def client() -> None:
        nonlocal conflicts
        done = 0
        while done < increments:
            current = await gateway.get(url)
            value, revision = int(current.content), int(current.headers["kv-revision"])
            await asyncio.sleep(0)
            written = await gateway.put(
                url, content=str(value + 1).encode(), headers={"If-Match": f'"{revision}"'}
            )
            if written.status_code == 412:
                assert written.json()["revision"] > revision
                conflicts += 1
                continue
            assert written.status_code == 200, written.text
            wins.append((revision, written.json()["revision"]))
            done += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    assert int((await gateway.get(url)).content) == clients * increments
    assert len(wins) == clients * increments
    assert len({read for read, _ in wins}) == len(wins)  # one winner per base revision
    chain = sorted(wins)
    assert chain[0][0] == first
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))  # a linear chain
    assert conflicts > 0  # the clients did race
    assert (await stored(nc, name))[1] == 1 + clients * increments


BAD_KEYS = [
    ("a*", "kv.key_invalid"),
    ("a.>", "kv.key_invalid"),
    ("*", "kv.key_invalid"),
    (">", "kv.key_invalid"),
    ("a%20b", "kv.key_invalid"),
    ("a%0Db", "kv.key_invalid"),
    ("a%0A", "kv.key_invalid"),
    ("a%0D%0AX-Injected:%201", "kv.key_invalid"),
    ("a..b", "kv.key_invalid"),
    (".a", "kv.key_invalid"),
    ("a.", "kv.key_invalid"),
    ("a%00b", "kv.key_invalid"),
    ("%C3%A9t%C3%A9", "kv.key_invalid"),
    ("_kv.x", "kv.key_reserved"),
    ("_kvx", "kv.key_reserved"),
]


@pytest.mark.parametrize(("key", "code"), BAD_KEYS)
async def test_bad_keys_write_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, key: str, code: str
) -> None:
    await make_bucket(gateway, name)
    problem(await gateway.put(f"/v1/kv/{name}/keys/{key}", content=b"x"), 400, code)
    problem(
        await gateway.put(
            f"/v1/kv/{name}/keys/{key}", content=b"x", headers={"If-None-Match": "*"}
        ),
        400,
        code,
    )
    problem(await gateway.delete(f"/v1/kv/{name}/keys/{key}"), 400, code)
    if code == "kv.key_invalid":
        problem(await gateway.get(f"/v1/kv/{name}/keys/{key}"), 400, code)
    assert await stored(nc, name) == (0, 0)


async def test_bad_preconditions_and_ttls_write_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, nats_release: tuple[int, int]
) -> None:
    await make_bucket(gateway, name)
    url = f"/v1/kv/{name}/keys/k"
    for value in ['"abc"', '"0"', 'W/"1"', '"1", "2"', '"1.5"', '"-1"']:
        problem(
            await gateway.put(url, content=b"x", headers={"If-Match": value}),
            400,
            "kv.revision_invalid",
        )
        problem(await gateway.delete(url, headers={"If-Match": value}), 400, "kv.revision_invalid")
    problem(
        await gateway.put(url, content=b"x", headers={"If-None-Match": '"1"'}),
        400,
        "kv.precondition_invalid",
    )
    problem(
        await gateway.put(url, content=b"x", headers={"If-None-Match": "*", "If-Match": '"1"'}),
        400,
        "kv.precondition_invalid",
    )
    problem(await gateway.put(url, content=b"x", params={"ttl": "10s"}), 400, "kv.ttl_not_allowed")
    problem(await gateway.delete(url, params={"ttl": "10s"}), 400, "kv.ttl_not_allowed")
    for ttl in ("soon", "0.5", "-1"):
        problem(
            await gateway.put(
                url, content=b"x", params={"ttl": ttl}, headers={"If-None-Match": "*"}
            ),
            400,
            "kv.ttl_invalid",
        )
    # A bucket without limit markers refuses per-key TTLs (the server does; nothing stored),
    # and a server without per-message TTLs (2.10) is not asked.
    problem(
        await gateway.put(url, content=b"x", params={"ttl": "10s"}, headers={"If-None-Match": "*"}),
        *(
            (409, "kv.ttl_disabled")
            if nats_release >= (2, 11)
            else (501, "nats.feature_unsupported")
        ),
    )
    assert await stored(nc, name) == (0, 0)


async def test_values_over_the_limits_write_nothing(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str, nats_release: tuple[int, int]
) -> None:
    await make_bucket(gateway, name, max_value_size=1024)
    url = f"/v1/kv/{name}/keys/k"
    assert (await gateway.put(url, content=b"x" * 1000)).status_code == 200
    problem(await gateway.put(url, content=b"x" * 1025), 413, "kv.value_too_large")
    # The server counts the headers a write carries: this value fits, with its condition not.
    conditional = await gateway.put(url, content=b"x" * 1020, headers={"If-Match": '"1"'})
    problem(conditional, 413, "kv.value_too_large")
    assert "1020 bytes" in conditional.json()["detail"], conditional.text
    assert "headers the write carries" in conditional.json()["detail"], conditional.text
    # A create over a key with a value: releases before 2.15 check the key before the size.
    problem(
        await gateway.put(url, content=b"x" * 1025, headers={"If-None-Match": "*"}),
        *((413, "kv.value_too_large") if nats_release >= (2, 15) else (412, "kv.key_exists")),
    )
    info = (await gateway.get("/v1/info")).json()
    max_payload = info["server"]["max_payload"]
    big = await gateway.put(f"/v1/kv/{name}/keys/big", content=b"x" * (max_payload + 1))
    assert big.status_code == 413, big.text
    assert big.json()["code"] in ("kv.value_too_large", "request.too_large")
    assert await stored(nc, name) == (1, 1)


async def test_a_marker_over_a_small_bound_is_refused_for_its_headers(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A delete marker has no value, but the server counts its headers in max_value_size: a
    conditional delete on a bucket bound that tight is refused 413, saying so, not 500."""
    await make_bucket(gateway, name, max_value_size=40)
    url = f"/v1/kv/{name}/keys/k"
    assert (await gateway.put(url, content=b"v")).status_code == 200
    refused = await gateway.delete(url, headers={"If-Match": '"1"'})
    problem(refused, 413, "kv.value_too_large")
    assert "the value (0 bytes) and the headers" in refused.json()["detail"], refused.text
    assert await stored(nc, name) == (1, 1)
    # Without the condition, the marker fits.
    assert (await gateway.delete(url)).status_code == 204
    assert (await gateway.get(url)).status_code == 404


@pytest.mark.server("2.11")
async def test_per_key_ttl_with_limit_markers(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """ADR-48: a TTL on create; the expiry leaves a MaxAge marker; the key can be created again."""
    await make_bucket(gateway, name, limit_marker_ttl="30s")
    url = f"/v1/kv/{name}/keys/session"
    created = await gateway.put(
        url, content=b"token", params={"ttl": "1s"}, headers={"If-None-Match": "*"}
    )
    assert created.status_code == 201
    stored_message = await nc.request(
        f"$JS.API.DIRECT.GET.KV_{name}.$KV.{name}.session", b"", timeout=2
    )
    assert stored_message.headers["Nats-TTL"] == "1s"
    await put(gateway, name, "other", b"stays")
    for _ in range(60):
        response = await gateway.get(url)
        if response.status_code == 404:
            break
        await asyncio.sleep(0.1)
    gone = problem(response, 404, "kv.key_not_found")
    assert gone["operation"] == "PURGE"  # the server's MaxAge marker reads as a purge
    keys = (await gateway.get(f"/v1/kv/{name}/keys")).json()["keys"]
    assert keys == ["other"]
    again = await gateway.put(url, content=b"new", headers={"If-None-Match": "*"})
    assert again.status_code == 201
    purge = await gateway.delete(url, params={"purge": "true", "ttl": "2s"})
    assert purge.status_code == 204
    marker = await nc.request(f"$JS.API.DIRECT.GET.KV_{name}.$KV.{name}.session", b"", timeout=2)
    assert marker.headers["KV-Operation"] == "PURGE" and marker.headers["Nats-TTL"] == "2s"


async def test_leader_reads_and_conditional_writes_carry_their_own_msg_id(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """consistency=leader reads the stream leader's last value (STREAM.MSG.GET); a
    conditional write carries a Nats-Msg-Id of the gateway's, so that a refusal can be
    confirmed by sending it again (the stream answers a stored copy as a duplicate)."""
    await make_bucket(gateway, name, history=5)
    url = f"/v1/kv/{name}/keys/k"
    await put(gateway, name, "k", b"a")  # a plain put: no id of the gateway's
    await put(gateway, name, "k", b"b", **{"If-Match": '"1"'})
    leader = await gateway.get(url, params={"consistency": "leader"}, headers=JSON_ACCEPT)
    assert leader.status_code == 200, leader.text
    direct = await gateway.get(url, headers=JSON_ACCEPT)
    assert leader.json() == direct.json()
    assert leader.json()["revision"] == 2 and leader.headers["etag"] == '"2"'

    js = nc.jetstream()
    plain, conditional = [await js.get_msg(f"KV_{name}", seq) for seq in (1, 2)]
    assert "Nats-Msg-Id" not in (plain.headers or {})
    assert conditional.headers is not None and conditional.headers["Nats-Msg-Id"].startswith(
        "jsgw-"
    )

    await gateway.delete(url)
    gone = problem(
        await gateway.get(url, params={"consistency": "leader"}), 404, "kv.key_not_found"
    )
    assert gone["operation"] == "DEL"
    problem(await gateway.get(url, params={"consistency": "leader", "revision": "1"}), 400)
    problem(await gateway.get(url, params={"consistency": "nearest"}), 400)
    problem(
        await gateway.get(f"/v1/kv/{name}x/keys/k", params={"consistency": "leader"}),
        404,
        "kv.bucket_not_found",
    )
