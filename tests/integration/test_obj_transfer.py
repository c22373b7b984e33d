"""Object transfers: uploads and downloads streamed, ranges, conditions, corrupt content, cut
off uploads, the body limit's exemption and the gateway's memory under a large object."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import nats
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway
from tests.integration.test_obj import CHUNK, digest, make_bucket

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def served(nats_server: EmbeddedServer) -> Iterator[str]:
    """A gateway on a real socket (streamed bodies, cut-off connections), with a small
    JSGW_MAX_BODY that object uploads are not held to."""
    with served_gateway(gateway_settings(nats_server.url, max_body=64 * 1024)) as url:
        yield url


@pytest.fixture
async def client(served: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served, timeout=30) as c:
        yield c


async def _batches(client: httpx.AsyncClient) -> float:
    """How many batched Direct Gets the gateway has sent (its NATS request metrics)."""
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith('jsgw_nats_request_duration_seconds_count{operation="direct.batch"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.server("2.11")  # (counts the batched Direct Gets it takes)
async def test_ranges_read_only_the_chunks_that_hold_them(
    client: httpx.AsyncClient, name: str
) -> None:
    await make_bucket(client, name)
    data = os.urandom(40 * CHUNK + 1000)  # 41 chunks: 6 batches of 8 for the whole
    path = f"/v1/obj/{name}/objects/big"
    assert (await client.put(path, content=data)).status_code == 201
    cases = {
        f"bytes={CHUNK * 39 + 5}-{CHUNK * 39 + 9}": data[CHUNK * 39 + 5 : CHUNK * 39 + 10],
        "bytes=-100": data[-100:],
        f"bytes={len(data) - 10}-": data[-10:],
        f"bytes={CHUNK - 1}-{CHUNK}": data[CHUNK - 1 : CHUNK + 1],
        "bytes=0-0": data[:1],
        f"bytes=5-{len(data) * 2}": data[5:],
    }
    for header, expected in cases.items():
        before = await _batches(client)
        response = await client.get(path, headers={"Range": header})
        assert response.status_code == 206, (header, response.text)
        assert response.content == expected, header
        assert response.headers["content-length"] == str(len(expected))
        first = (
            len(data) - len(expected)
            if header.startswith("bytes=-")
            else int(header[6:].split("-")[0])
        )
        assert response.headers["content-range"] == (
            f"bytes {first}-{first + len(expected) - 1}/{len(data)}"
        )
        # The chunks of the range, not all 41: one batch of up to 8 for these.
        wanted = (first + len(expected) - 1) // CHUNK - first // CHUNK + 1
        assert await _batches(client) - before == (wanted + 7) // 8, header
    before = await _batches(client)
    whole = await client.get(path)
    assert whole.content == data and await _batches(client) - before == 6

    for header in (f"bytes={len(data)}-", f"bytes={len(data) + 5}-{len(data) + 9}"):
        response = await client.get(path, headers={"Range": header})
        problem(response, 416, "obj.range_not_satisfiable")
        assert response.headers["content-range"] == f"bytes */{len(data)}"
    # Not one well-formed range: ignored, the whole object (RFC 9110).
    for header in ("bytes=5-1", "items=0-5", "bytes=0-1,5-6"):
        response = await client.get(path, headers={"Range": header})
        assert response.status_code == 200 and len(response.content) == len(data), header


async def test_conditions_and_headers(client: httpx.AsyncClient, name: str) -> None:
    await make_bucket(client, name)
    path = f"/v1/obj/{name}/objects/a.txt"
    created = await client.put(
        path, content=b"one", headers={"If-None-Match": "*", "Content-Type": "text/plain"}
    )
    assert created.status_code == 201
    tag = created.headers["etag"]
    assert tag == f'"{digest(b"one")}"'
    refused = await client.put(path, content=b"two", headers={"If-None-Match": "*"})
    assert problem(refused, 412, "obj.exists") and refused.headers["etag"] == tag
    stale = await client.put(path, content=b"two", headers={"If-Match": f'"{digest(b"x")}"'})
    problem(stale, 412, "obj.changed")
    replaced = await client.put(path, content=b"two", headers={"If-Match": tag})
    assert replaced.status_code == 200 and replaced.json()["digest"] == digest(b"two")
    problem(await client.put(path, content=b"3", headers={"If-Match": tag}), 412, "obj.changed")
    problem(
        await client.put(f"/v1/obj/{name}/objects/new", content=b"3", headers={"If-Match": tag}),
        412,
        "obj.changed",
    )

    new_tag = replaced.headers["etag"]
    head = await client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == "3" and head.headers["etag"] == new_tag
    assert head.headers["content-type"] == "application/octet-stream"  # not kept on a replace
    assert head.headers["last-modified"].endswith(" GMT")
    assert (await client.get(path, headers={"If-None-Match": new_tag})).status_code == 304
    assert (await client.get(path, headers={"If-None-Match": tag})).status_code == 200

    typed = await client.put(
        path,
        content=b"<p>",
        headers={"Content-Type": "text/html", "X-Object-Meta-Owner": "ann"},
    )
    got = await client.get(path)
    assert (
        got.headers["content-type"] == "text/html" and got.headers["x-object-meta-owner"] == "ann"
    )
    assert got.headers["etag"] == typed.headers["etag"]
    # A deleted object may be created again with If-None-Match: *.
    assert (await client.delete(path)).status_code == 204
    problem(await client.delete(path), 404, "obj.not_found")
    assert (
        await client.put(path, content=b"again", headers={"If-None-Match": "*"})
    ).status_code == 201


async def test_uploads_are_not_held_to_the_body_limit(client: httpx.AsyncClient, name: str) -> None:
    await make_bucket(client, name)
    data = os.urandom(MiB)  # over the gateway's JSGW_MAX_BODY of 64 KiB
    response = await client.put(f"/v1/obj/{name}/objects/big", content=data)
    assert response.status_code == 201, response.text
    assert (await client.get(f"/v1/obj/{name}/objects/big")).content == data

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield os.urandom(100_000)

    response = await client.put(f"/v1/obj/{name}/objects/chunked", content=chunked())
    assert response.status_code == 201 and response.json()["size"] == 400_000
    # Every other route still is (a body just over it: the socket takes it whole before the
    # gateway answers and closes the connection).
    kv, over = f"/v1/kv/{name}", data[: 80 * 1024]
    assert (await client.put(kv)).status_code == 201
    problem(await client.put(f"{kv}/keys/k", content=over), 413, "request.too_large")
    problem(await client.post(f"/v1/publish/{name}.x", content=over), 413, "request.too_large")
    # The bucket's own max_bytes is what bounds an upload (enforced by the server).
    small = name + "s"
    await make_bucket(client, small, max_bytes=MiB)
    refused = await client.put(f"/v1/obj/{small}/objects/big", content=os.urandom(2 * MiB))
    problem(refused, 413, "obj.bucket_full")
    listing = await client.get(f"/v1/obj/{small}/objects")
    assert listing.json()["objects"] == []


async def test_a_cut_off_upload_leaves_nothing(
    served: str, client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(client, name)
    await client.put(f"/v1/obj/{name}/objects/kept", content=b"previous version")
    host, port = served.removeprefix("http://").split(":")
    head = (
        f"PUT /v1/obj/{name}/objects/kept HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Length: {10 * MiB}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode())
        sock.sendall(os.urandom(3 * MiB))  # some chunks stored before the client goes
        await asyncio.sleep(0.3)
    js = nc.jetstream()
    deadline = time.monotonic() + 5
    while True:
        info = await js.stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")
        if len(info.state.subjects or {}) == 1:
            break
        assert time.monotonic() < deadline, info.state.subjects
        await asyncio.sleep(0.05)
    assert (await client.get(f"/v1/obj/{name}/objects/kept")).content == b"previous version"
    nuid = (await client.get(f"/v1/obj/{name}/info/kept")).json()["nuid"]
    assert info.state.subjects == {f"$O.{name}.C.{nuid}": 1}


async def test_a_digest_mismatch_cuts_the_download_off(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    await make_bucket(client, name)
    data = os.urandom(3 * CHUNK + 5)
    info = (await client.put(f"/v1/obj/{name}/objects/x", content=data)).json()
    # The meta message rewritten with another digest, as a corrupt store would have it.
    meta = {**info, "digest": digest(b"something else"), "options": {"max_chunk_size": CHUNK}}
    subject = f"$O.{name}.M." + base64.urlsafe_b64encode(b"x").decode()
    await nc.jetstream().publish(subject, json.dumps(meta).encode(), headers={"Nats-Rollup": "sub"})
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        async with client.stream("GET", f"/v1/obj/{name}/objects/x") as response:
            assert response.status_code == 200
            async for piece in response.aiter_raw():
                received += piece
    # Everything but the last chunk went out; the last is withheld: never the whole object.
    assert len(received) < len(data) and bytes(received) == data[: len(received)]
    # A range carries no digest to check: it is served.
    ranged = await client.get(f"/v1/obj/{name}/objects/x", headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206 and ranged.content == data[:10]


class PeakRss:
    """The process's resident set size, sampled every few milliseconds in a thread."""

    def __init__(self) -> None:
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_memory_stays_flat_for_a_large_object(client: httpx.AsyncClient, name: str) -> None:
    """256 MiB up and down through the gateway (in this process) raise its RSS by no more
    than a few chunk buffers' worth: nothing holds the object whole."""
    await make_bucket(client, name, storage="file")
    size = 256 * MiB
    block = os.urandom(MiB)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(size // MiB):
            yield block

    start = PeakRss.now()
    with PeakRss() as rss:
        response = await client.put(f"/v1/obj/{name}/objects/large", content=body())
        assert response.status_code == 201, response.text
        up_peak = rss.peak
        seen = 0
        async with client.stream("GET", f"/v1/obj/{name}/objects/large") as download:
            async for piece in download.aiter_raw():
                seen += len(piece)
    assert seen == size
    grew = (rss.peak - start) / MiB
    print(
        f"\nRSS {start / MiB:.0f} MiB, peak {rss.peak / MiB:.0f} MiB "
        f"(upload {up_peak / MiB:.0f}), +{grew:.1f} MiB for {size // MiB} MiB up and down"
    )
    assert grew < 48, grew


async def test_an_upload_replaces_what_is_there_when_it_is_stored(
    client: httpx.AsyncClient, nc: nats.NATS, name: str
) -> None:
    """Another version stored while an upload streams is the one it replaces: its chunks go,
    and only the last version's stay."""
    await make_bucket(client, name)
    path = f"/v1/obj/{name}/objects/x"
    await client.put(path, content=b"v0")
    halfway = asyncio.Event()
    go_on = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield os.urandom(CHUNK)
        halfway.set()
        await go_on.wait()
        yield os.urandom(CHUNK)

    async with httpx.AsyncClient(base_url=str(client.base_url), timeout=30) as other:
        upload = asyncio.ensure_future(other.put(path, content=slow()))
        await asyncio.wait_for(halfway.wait(), 10)
        meanwhile = await client.put(path, content=b"v1")
        assert meanwhile.status_code == 200
        go_on.set()
        last = await upload
    assert last.status_code == 200 and last.json()["size"] == 2 * CHUNK
    info = await nc.jetstream().stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")
    assert info.state.subjects == {f"$O.{name}.C.{last.json()['nuid']}": 2}
