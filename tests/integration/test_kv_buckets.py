"""KV bucket administration against a real nats-server: the stream is exactly ADR-8's."""

from __future__ import annotations

import httpx
import nats
import orjson
import pytest

from tests.helpers import problem


async def stream_config(nc: nats.NATS, bucket: str) -> dict:
    """The stream config as the server holds it (raw, nanoseconds)."""
    reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", b"", timeout=2)
    return orjson.loads(reply.data)["config"]


async def make_bucket(gw: httpx.AsyncClient, bucket: str, **config: object) -> dict:
    response = await gw.put(f"/v1/kv/{bucket}", json=config)
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.server("2.11")
async def test_create_with_every_option_makes_the_adr8_stream(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    status = await make_bucket(
        gateway,
        name,
        history=7,
        ttl="90s",
        max_value_size=4096,
        max_bytes=1 << 20,
        storage="memory",
        replicas=1,
        compression=True,
        description="users",
        placement={"tags": []},
        republish={"src": f"$KV.{name}.>", "dest": f"repub.{name}.>", "headers_only": True},
        limit_marker_ttl="5s",
    )
    config = await stream_config(nc, name)
    assert config["name"] == f"KV_{name}"
    assert config["subjects"] == [f"$KV.{name}.>"]
    assert config["max_msgs_per_subject"] == 7
    assert config["max_age"] == 90 * 10**9
    assert config["duplicate_window"] == 90 * 10**9  # ttl < 2 min: the same as the ttl
    assert config["max_msg_size"] == 4096
    assert config["max_bytes"] == 1 << 20
    assert config["storage"] == "memory"
    assert config["compression"] == "s2"
    assert config["discard"] == "new"
    assert config["retention"] == "limits"
    assert config["max_msgs"] == -1 and config["max_consumers"] == -1
    assert config["allow_rollup_hdrs"] is True
    assert config["deny_delete"] is True
    assert config["allow_direct"] is True
    assert config["allow_msg_ttl"] is True
    assert config["subject_delete_marker_ttl"] == 5 * 10**9
    assert config["description"] == "users"
    assert config["republish"] == {
        "src": f"$KV.{name}.>",
        "dest": f"repub.{name}.>",
        "headers_only": True,
    }
    assert status["bucket"] == name and status["history"] == 7 and status["ttl"] == 90
    assert status["is_compressed"] is True and status["backing_store"] == "JetStream"
    assert status["limit_marker_ttl"] == 5 and status["storage"] == "memory"


async def test_defaults_update_status_list_delete(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    created = await gateway.put(f"/v1/kv/{name}")  # no body: ADR-8 defaults
    assert created.status_code == 201
    config = await stream_config(nc, name)
    assert config["max_msgs_per_subject"] == 1
    assert config["max_age"] == 0
    assert config["duplicate_window"] == 120 * 10**9
    assert config["compression"] == "none" and config["storage"] == "file"

    updated = await gateway.put(f"/v1/kv/{name}", json={"history": 10, "ttl": "1h"})
    assert updated.status_code == 200
    config = await stream_config(nc, name)
    assert config["max_msgs_per_subject"] == 10
    assert config["max_age"] == 3600 * 10**9
    assert config["duplicate_window"] == 120 * 10**9  # ttl over 2 minutes: capped

    await gateway.put(f"/v1/kv/{name}/keys/a", content=b"1")
    await gateway.put(f"/v1/kv/{name}/keys/a", content=b"22")
    status = (await gateway.get(f"/v1/kv/{name}")).json()
    assert (status["values"], status["history"], status["ttl"]) == (2, 10, 3600)
    assert status["bytes"] > 0 and status["last_revision"] == 2
    assert set(status) >= {
        "bucket",
        "values",
        "history",
        "ttl",
        "bytes",
        "is_compressed",
        "backing_store",
    }

    listing = (await gateway.get("/v1/kv")).json()["buckets"]
    assert name in [b["bucket"] for b in listing]
    # Plain streams are not buckets.
    await gateway.put(f"/v1/streams/{name}S", json={"subjects": [f"{name.lower()}.>"]})
    listing = (await gateway.get("/v1/kv")).json()["buckets"]
    assert f"{name}S" not in [b["bucket"] for b in listing]
    assert f"{name}S" not in [b["stream"] for b in listing]

    assert (await gateway.delete(f"/v1/kv/{name}")).status_code == 204
    problem(await gateway.get(f"/v1/kv/{name}"), 404, "kv.bucket_not_found")
    problem(await gateway.delete(f"/v1/kv/{name}"), 404, "kv.bucket_not_found")
    problem(await gateway.get(f"/v1/kv/{name}/keys/a"), 404, "kv.bucket_not_found")
    problem(await gateway.put(f"/v1/kv/{name}/keys/a", content=b"x"), 404, "kv.bucket_not_found")
    problem(await gateway.get(f"/v1/kv/{name}/keys"), 404, "kv.bucket_not_found")
    problem(await gateway.get(f"/v1/kv/{name}/history/a"), 404, "kv.bucket_not_found")


@pytest.mark.server("2.11")
async def test_limit_markers_cannot_be_turned_off(gateway: httpx.AsyncClient, name: str) -> None:
    await make_bucket(gateway, name)
    enabled = await gateway.put(f"/v1/kv/{name}", json={"limit_marker_ttl": 2})
    assert enabled.status_code == 200 and enabled.json()["limit_marker_ttl"] == 2
    problem(
        await gateway.put(f"/v1/kv/{name}", json={"history": 3}), 409, "kv.limit_markers_locked"
    )
    assert (await gateway.get(f"/v1/kv/{name}")).json()["history"] == 1


async def test_a_stream_that_is_not_a_bucket_is_left_alone(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await gateway.put(f"/v1/streams/KV_{name}", json={"subjects": [f"{name.lower()}.>"]})
    problem(await gateway.put(f"/v1/kv/{name}", json={}), 409, "kv.not_a_bucket")
    assert (await stream_config(nc, name))["subjects"] == [f"{name.lower()}.>"]


async def test_bad_bucket_input_creates_nothing(gateway: httpx.AsyncClient, name: str) -> None:
    for bad in ["a.b", "a b", "a*", ">", "a%0A", "%24KV"]:
        problem(await gateway.put(f"/v1/kv/{bad}", json={}), 400, "kv.bucket_invalid")
        problem(await gateway.get(f"/v1/kv/{bad}"), 400, "kv.bucket_invalid")
        problem(await gateway.get(f"/v1/kv/{bad}/keys/k"), 400, "kv.bucket_invalid")
    for body in [
        {"history": 0},
        {"history": 65},
        {"ttl": "soon"},
        {"ttl": -1},
        {"ttl": "50ms"},  # (a stream's max_age is at least 100 ms)
        {"ttl": 1e-50},
        {"max_value_size": 0},
        {"limit_marker_ttl": 0.5},
        {"storage": "disk"},
        {"compression": "zstd"},
        {"nope": 1},
        ["history"],
    ]:
        problem(await gateway.put(f"/v1/kv/{name}", json=body), 400, "request.invalid")
    short = problem(await gateway.put(f"/v1/kv/{name}", json={"ttl": "2ms"}), 400)
    assert "ttl is at least 0.1 s (or 0: forever)" in short["detail"], short
    problem(await gateway.get(f"/v1/kv/{name}"), 404, "kv.bucket_not_found")
