"""A client that openapi-python-client generates from the committed spec drives a real gateway
and nats-server: KV writes with If-None-Match and If-Match, publish with Nats-Msg-Id (and its
duplicate), a durable pull consumer's fetch and ack.

The client is generated at test time, so the spec as committed is what is tested: an operation,
parameter or schema the generator cannot express fails here (``--fail-on-warning``), and so does
an answer the generated models cannot read. Only the generated functions and models are used.
"""

from __future__ import annotations

import base64
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
PACKAGE = "jsgw_generated_client"
# pyproject.toml's test extra installs it next to the interpreter running the suite.
BIN = Path(sys.executable).parent
GENERATOR = BIN / "openapi-python-client"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The generated package, imported; its api and models modules are loaded by name."""
    if not GENERATOR.is_file():
        pytest.fail(f"{GENERATOR} is missing: install the test extra (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("generated")
    # The generator formats its output with ruff from PATH (a warning, and --fail-on-warning,
    # otherwise): the suite's own ruff.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The streamed batch formats (NDJSON, Arrow IPC) are bodies the generator has no reader
    # for: a client reads them as bytes, which is what the generator's documented override for
    # such content types says (the range read offers nothing else).
    config = root / "generator.json"
    config.write_text(
        '{"content_type_overrides": {"application/x-ndjson": "application/octet-stream", '
        '"application/vnd.apache.arrow.stream": "application/octet-stream"}}'
    )
    command = [str(GENERATOR), "generate", "--path", str(SPEC), "--meta", "none"]
    command += ["--config", str(config)]
    command += ["--output-path", str(root / PACKAGE), "--fail-on-warning"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the generator failed:\n{run.stdout}\n{run.stderr}"
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def load(name: str) -> Any:
    """A module of the generated package (``api.kv.put_key``, ``models``, ``types``)."""
    return importlib.import_module(f"{PACKAGE}.{name}")


@pytest.fixture
def client(generated: ModuleType, gateway_url: str) -> Iterator[Any]:
    with generated.Client(base_url=gateway_url, raise_on_unexpected_status=True) as client:
        yield client


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_kv_put_get_and_conditional_updates(client: Any) -> None:
    models, types = load("models"), load("types")
    put_bucket, put_key, get_key = (
        load(f"api.kv.{n}") for n in ("put_bucket", "put_key", "get_key")
    )
    bucket, key = "genclient", "orders.42"

    created = put_bucket.sync_detailed(bucket, client=client, body=models.KVConfig(history=5))
    assert created.status_code == 201, created.content
    assert isinstance(created.parsed, models.KVStatus)
    assert (created.parsed.bucket, created.parsed.history) == (bucket, 5)

    first = put_key.sync_detailed(
        bucket, key, client=client, body=types.File(payload=b"v1"), if_none_match="*"
    )
    assert first.status_code == 201, first.content
    assert isinstance(first.parsed, models.KVWriteResult)
    r1 = first.parsed.revision
    assert first.headers["ETag"] == f'"{r1}"'

    # The spec offers the raw value and Entry JSON for one 200; OpenAPI leaves Accept out of
    # the parameters, and the generated function reads the JSON one: the client asks for it
    # with its own headers.
    as_json = client.with_headers({"Accept": "application/json"})
    entry = get_key.sync_detailed(bucket, key, client=as_json)
    assert entry.status_code == 200, entry.content
    assert isinstance(entry.parsed, models.KVEntry)
    assert (entry.parsed.key, entry.parsed.revision) == (key, r1)
    assert entry.parsed.value == b64(b"v1")
    assert entry.parsed.operation == models.KVEntryOperation.PUT
    assert entry.headers["ETag"] == f'"{r1}"'

    updated = put_key.sync_detailed(
        bucket, key, client=client, body=types.File(payload=b"v2"), if_match=f'"{r1}"'
    )
    assert updated.status_code == 200, updated.content
    r2 = updated.parsed.revision
    assert r2 > r1
    assert updated.headers["ETag"] == f'"{r2}"'

    stale = put_key.sync_detailed(
        bucket, key, client=client, body=types.File(payload=b"v3"), if_match=f'"{r1}"'
    )
    assert stale.status_code == 412, stale.content
    assert isinstance(stale.parsed, models.Problem)
    assert stale.parsed.code == models.ProblemCode.KV_REVISION_MISMATCH
    assert stale.parsed.additional_properties["revision"] == r2

    latest = get_key.sync_detailed(bucket, key, client=as_json)
    assert (latest.parsed.revision, latest.parsed.value) == (r2, b64(b"v2"))


def test_publish_fetch_and_ack(client: Any) -> None:
    models, types = load("models"), load("types")
    put_stream = load("api.streams.put_stream")
    publish_one = load("api.publish.publish_one")
    put_consumer, get_consumer, fetch_messages, ack_messages = (
        load(f"api.consumers.{n}")
        for n in ("put_consumer", "get_consumer", "fetch_messages", "ack_messages")
    )
    stream, consumer = "GENCLIENT", "worker"

    made = put_stream.sync_detailed(
        stream, client=client, body=models.StreamConfig(subjects=["genclient.>"])
    )
    assert made.status_code == 201, made.content
    assert isinstance(made.parsed, models.StreamInfo)

    def publish(data: bytes, msg_id: str) -> Any:
        answer = publish_one.sync_detailed(
            "genclient.orders", client=client, body=types.File(payload=data), nats_msg_id=msg_id
        )
        assert answer.status_code == 200, answer.content
        assert isinstance(answer.parsed, models.PubAck)
        return answer.parsed

    one = publish(b"m1", "order-1")
    assert (one.stream, one.seq, one.duplicate) == (stream, 1, False)
    again = publish(b"m1", "order-1")
    assert (again.seq, again.duplicate) == (1, True)
    two = publish(b"m2", "order-2")
    assert (two.seq, two.duplicate) == (2, False)

    config = models.ConsumerConfig(
        durable_name=consumer, ack_policy=models.ConsumerConfigAckPolicy.EXPLICIT
    )
    durable = put_consumer.sync_detailed(stream, consumer, client=client, body=config)
    assert durable.status_code == 201, durable.content
    assert durable.parsed.num_pending == 2

    fetched = fetch_messages.sync_detailed(
        stream, consumer, client=client, body=models.FetchRequest(max_messages=5, no_wait=True)
    )
    assert fetched.status_code == 200, fetched.content
    assert isinstance(fetched.parsed, models.FetchResult)
    messages = fetched.parsed.messages
    assert [(m.seq, m.data, m.delivered) for m in messages] == [
        (1, b64(b"m1"), 1),
        (2, b64(b"m2"), 1),
    ]
    assert messages[0].headers.additional_properties["Nats-Msg-Id"] == ["order-1"]
    assert get_consumer.sync(stream, consumer, client=client).num_ack_pending == 2

    acks = models.AckBatch(acks=[models.AckItem(token=m.ack_token) for m in messages])
    acked = ack_messages.sync_detailed(stream, consumer, client=client, body=acks)
    assert acked.status_code == 200, acked.content
    assert [(r.index, r.ok) for r in acked.parsed.results] == [(0, True), (1, True)]

    info = get_consumer.sync(stream, consumer, client=client)
    assert isinstance(info, models.ConsumerInfo)
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
    # The spec leaves ack_floor a free-form object: its fields are additional properties.
    assert info.ack_floor.additional_properties["stream_seq"] == 2
