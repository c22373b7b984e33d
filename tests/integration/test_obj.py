"""Object buckets (ADR-20) through the gateway, and interop with nats-py's object store both
ways: the same stream, chunk and meta subjects, digests, deleted markers and links."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import httpx
import nats
import nats.js.errors
import pytest
from nats.js.api import ObjectMeta, ObjectMetaOptions

from tests.helpers import problem

CHUNK = 128 * 1024


def digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


async def make_bucket(gateway: httpx.AsyncClient, bucket: str, **config: object) -> dict:
    response = await gateway.put(f"/v1/obj/{bucket}", json=config or None)
    assert response.status_code == 201, response.text
    return response.json()


async def test_bucket_lifecycle(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    status = await make_bucket(gateway, name, description="files", ttl="1h")
    assert status["bucket"] == name and status["stream"] == f"OBJ_{name}"
    assert status["ttl"] == 3600 and status["description"] == "files"
    info = await nc.jetstream().stream_info(f"OBJ_{name}")
    assert sorted(info.config.subjects) == [f"$O.{name}.C.>", f"$O.{name}.M.>"]
    assert info.config.allow_rollup_hdrs and info.config.allow_direct
    again = await gateway.put(f"/v1/obj/{name}", json={"description": "more files"})
    assert again.status_code == 200 and again.json()["description"] == "more files"
    listed = (await gateway.get("/v1/obj")).json()["buckets"]
    assert name in [b["bucket"] for b in listed]
    assert (await gateway.get(f"/v1/obj/{name}")).json()["bucket"] == name
    assert (await gateway.delete(f"/v1/obj/{name}")).status_code == 204
    problem(await gateway.get(f"/v1/obj/{name}"), 404, "obj.bucket_not_found")
    # A ttl under what nats-server takes as a stream's max_age (100 ms) is refused first.
    short = problem(await gateway.put(f"/v1/obj/{name}", json={"ttl": "2ms"}), 400)
    assert "ttl is at least 0.1 s (or 0: forever)" in short["detail"], short
    problem(await gateway.get(f"/v1/obj/{name}"), 404, "obj.bucket_not_found")
    problem(
        await gateway.put(f"/v1/obj/{name}/objects/x", content=b"1"), 404, "obj.bucket_not_found"
    )


async def test_nats_py_reads_what_the_gateway_wrote(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(gateway, name)
    data = os.urandom(3 * CHUNK + 1234)  # four chunks
    response = await gateway.put(
        f"/v1/obj/{name}/objects/dir/report.bin",
        content=data,
        headers={
            "Content-Type": "application/x-report",
            "X-Object-Description": "the report",
            "X-Object-Meta-Owner": "ann",
        },
    )
    assert response.status_code == 201, response.text
    info = response.json()
    assert info["size"] == len(data) and info["chunks"] == 4
    assert info["digest"] == digest(data)
    assert response.headers["etag"] == f'"{digest(data)}"'
    assert info["headers"] == {"Content-Type": ["application/x-report"]}
    assert info["metadata"] == {"owner": "ann"} and info["description"] == "the report"

    store = await nc.jetstream().object_store(name)
    got = await store.get("dir/report.bin")  # nats-py checks the digest itself
    assert got.data == data
    assert got.info.nuid == info["nuid"] and got.info.chunks == 4
    assert got.info.description == "the report"
    # The layout is ADR-20's: chunks on the nuid's subject, meta on the base64url name.
    js = nc.jetstream()
    meta = await js.get_last_msg(
        f"OBJ_{name}", f"$O.{name}.M." + base64.urlsafe_b64encode(b"dir/report.bin").decode()
    )
    assert meta.headers and meta.headers.get("Nats-Rollup") == "sub"
    stream = await js.stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")
    assert stream.state.subjects == {f"$O.{name}.C.{info['nuid']}": 4}

    # Replaced: the old version's chunks are purged.
    second = await gateway.put(f"/v1/obj/{name}/objects/dir/report.bin", content=b"v2")
    assert second.status_code == 200
    assert (await store.get("dir/report.bin")).data == b"v2"
    stream = await js.stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")
    assert stream.state.subjects == {f"$O.{name}.C.{second.json()['nuid']}": 1}

    # Deleted by the gateway: nats-py sees it gone, and the deleted marker with show_deleted.
    assert (await gateway.delete(f"/v1/obj/{name}/objects/dir/report.bin")).status_code == 204
    with pytest.raises(nats.js.errors.ObjectNotFoundError):
        await store.get_info("dir/report.bin")
    assert (await store.get_info("dir/report.bin", show_deleted=True)).deleted
    stream = await js.stream_info(f"OBJ_{name}")
    assert stream.state.messages == 1  # only the deleted marker


async def test_gateway_reads_what_nats_py_wrote(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    js = nc.jetstream()
    store = await js.create_object_store(name)
    data = os.urandom(2 * CHUNK + 77)
    await store.put("photo.jpg", data, meta=ObjectMeta(description="a photo"))
    response = await gateway.get(f"/v1/obj/{name}/objects/photo.jpg")
    assert response.status_code == 200
    assert response.content == data
    assert response.headers["content-length"] == str(len(data))
    assert response.headers["etag"] == f'"{digest(data)}"'
    assert response.headers["x-object-description"] == "a photo"
    assert "last-modified" in response.headers
    ranged = await gateway.get(
        f"/v1/obj/{name}/objects/photo.jpg", headers={"Range": f"bytes={CHUNK - 5}-{CHUNK + 5}"}
    )
    assert ranged.status_code == 206 and ranged.content == data[CHUNK - 5 : CHUNK + 6]
    listed = (await gateway.get(f"/v1/obj/{name}/objects")).json()["objects"]
    assert [(o["name"], o["size"]) for o in listed] == [("photo.jpg", len(data))]

    await store.put("empty", b"")
    empty = await gateway.get(f"/v1/obj/{name}/objects/empty")
    assert empty.status_code == 200 and empty.content == b""

    await store.delete("photo.jpg")
    problem(await gateway.get(f"/v1/obj/{name}/objects/photo.jpg"), 404, "obj.not_found")
    listed = (await gateway.get(f"/v1/obj/{name}/objects?include_deleted=true")).json()
    assert {o["name"]: o.get("deleted", False) for o in listed["objects"]} == {
        "photo.jpg": True,
        "empty": False,
    }


async def test_links_are_followed(gateway: httpx.AsyncClient, nc: nats.NATS, name: str) -> None:
    other = name + "b"
    await make_bucket(gateway, name)
    await make_bucket(gateway, other)
    data = os.urandom(CHUNK + 10)
    await gateway.put(f"/v1/obj/{other}/objects/target", content=data)
    js = nc.jetstream()
    # A link as ADR-20 writes it (nats-py 2.16 has no add_link): a meta message whose
    # options.link names the object, with a nuid and no chunks.
    link = {
        "name": "alias",
        "bucket": name,
        "nuid": "LINKNUID0000000000000",
        "size": 0,
        "chunks": 0,
        "mtime": "2026-01-01T00:00:00Z",
        "options": {"link": {"bucket": other, "name": "target"}},
    }
    subject = f"$O.{name}.M." + base64.urlsafe_b64encode(b"alias").decode()
    await js.publish(subject, json.dumps(link).encode(), headers={"Nats-Rollup": "sub"})
    followed = await gateway.get(f"/v1/obj/{name}/objects/alias")
    assert followed.status_code == 200 and followed.content == data
    # nats-py follows the gateway's link the same way.
    store = await js.object_store(name)
    assert (await store.get("alias")).data == data
    # A link to a whole bucket has no content.
    link["name"], link["options"] = "dir", {"link": {"bucket": other}}
    subject = f"$O.{name}.M." + base64.urlsafe_b64encode(b"dir").decode()
    await js.publish(subject, json.dumps(link).encode(), headers={"Nats-Rollup": "sub"})
    problem(await gateway.get(f"/v1/obj/{name}/objects/dir"), 409, "obj.link_to_bucket")


async def test_nats_py_options_meta_roundtrip(
    gateway: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """A gateway object's info parses in nats-py with its options (chunk size) intact."""
    await make_bucket(gateway, name)
    await gateway.put(f"/v1/obj/{name}/objects/a", content=b"abc")
    store = await nc.jetstream().object_store(name)
    info = await store.get_info("a")
    assert info.options == ObjectMetaOptions(max_chunk_size=CHUNK)
    assert info.digest == digest(b"abc") and info.size == 3
