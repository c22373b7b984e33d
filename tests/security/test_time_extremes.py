"""No time or duration a client sends can make the gateway answer a 5xx.

A time that is valid RFC 3339 can still leave the range of a date once in UTC
(``9999-12-31T23:59:59-00:01`` is the year 10000), and a duration can overflow NATS's int64
nanoseconds. Every time and duration input of the spec (fields with ``format: date-time`` or
``format: go-duration``, found by walking openapi/openapi.json) and the other duration inputs
(``?ttl=``, ``Nats-TTL``) gets its extremes from hypothesis, against a real gateway (uvicorn
on uvloop, as ``jsgw serve``) and nats-server: the answer is a 2xx, or a 4xx problem+json,
never a 5xx.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway
from tests.security.extremes import DURATION_TEXTS, DURATIONS, TIME_JSON, TIMES

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
STREAM, CONSUMER, BUCKET, TTL_STREAM = "EXT", "C", "EXTKV", "EXTTTL"
EXAMPLES = 40

# -- the inputs --------------------------------------------------------------------------------

Sender = Callable[[httpx.Client, str, "World"], httpx.Response]
"""Sends one request with the value (JSON text for body fields, raw text otherwise)."""


@dataclass
class World:
    ack_token: str
    names: Iterator[int]


def _json_body(template: str) -> Callable[[str], bytes]:
    """A JSON body whose ``@`` is replaced with the value's literal JSON text."""
    return lambda value: template.replace("@", value).encode()


def _put_then_delete(path: str, template: str) -> Sender:
    body = _json_body(template)

    def send(client: httpx.Client, value: str, world: World) -> httpx.Response:
        name = f"X{next(world.names)}"
        response = client.put(
            path.format(name=name),
            content=body(value),
            headers={"content-type": "application/json"},
        )
        if response.status_code < 300:
            client.delete(path.format(name=name))
        return response

    return send


def _post(path: str, template: str) -> Sender:
    body = _json_body(template)

    def send(client: httpx.Client, value: str, world: World) -> httpx.Response:
        content = body(value).replace(b"{token}", world.ack_token.encode())
        return client.post(path, content=content, headers={"content-type": "application/json"})

    return send


def _get(path: str, name: str) -> Sender:
    def send(client: httpx.Client, value: str, world: World) -> httpx.Response:
        return client.get(path, params={name: value})

    return send


def _consume(name: str) -> Sender:
    def send(client: httpx.Client, value: str, world: World) -> httpx.Response:
        path = f"/v1/streams/{STREAM}/consumers/{CONSUMER}/consume"
        with client.stream("GET", path, params={name: value}) as response:
            if response.status_code >= 300:
                response.read()
            return response  # an accepted consume is left at its first event

    return send


def _kv_put_ttl(client: httpx.Client, value: str, world: World) -> httpx.Response:
    key = f"k{next(world.names)}"
    return client.put(
        f"/v1/kv/{BUCKET}/keys/{key}",
        params={"ttl": value},
        content=b"v",
        headers={"if-none-match": "*"},
    )


def _kv_purge_ttl(client: httpx.Client, value: str, world: World) -> httpx.Response:
    return client.delete(f"/v1/kv/{BUCKET}/keys/a", params={"purge": "true", "ttl": value})


def _publish_ttl(client: httpx.Client, value: str, world: World) -> httpx.Response:
    return client.post("/v1/publish/ttl.a", content=b"x", headers={"Nats-TTL": value.encode()})


def _publish_batch_ttl(client: httpx.Client, value: str, world: World) -> httpx.Response:
    body = {"messages": [{"subject": "ttl.b", "headers": {"Nats-TTL": value}}]}
    return client.post("/v1/publish", json=body)


def _subscription_timeout(client: httpx.Client, value: str, world: World) -> httpx.Response:
    # A consumer of its own each time (made by the PUT, deleted with it): the subscription
    # must not take the messages the other inputs' consumers hold.
    name = f"S{next(world.names)}"
    fields = f'"stream": "{STREAM}", "consumer": "{name}", "endpoint": "{_DEAD_END}"'
    body = f'{{{fields}, "timeout": {value}}}'
    response = client.put(
        f"/v1/subscriptions/{name}",
        content=body.encode(),
        headers={"content-type": "application/json"},
    )
    if response.status_code < 300:
        client.delete(f"/v1/subscriptions/{name}", params={"delete_consumer": "true"})
    return response


def _core_request_timeout(client: httpx.Client, value: str, world: World) -> httpx.Response:
    # To a subject the TTL stream captures: JetStream answers a core request there with its
    # PubAck, so a valid timeout gets a 200 (no subject of the account is free of 503s else).
    return client.post("/v1/nats/request/ttl.core", content=b"x", params={"timeout": value})


_DEAD_END = "http://127.0.0.1:9/hook"  # (port 9, discard: refused on loopback)
_STREAM_PATH = "/v1/streams/{name}"
_PAUSED = f"/v1/streams/{STREAM}/consumers/PAUSED/pause"
_CONSUMER_PATH = f"/v1/streams/{STREAM}/consumers/{{name}}"
_SUBJECTS = '"subjects": ["x.{name}.>"], "storage": "memory"'
TIME = "time"
DURATION = "duration"

# (spec location, kind) -> how to send a value there
INPUTS: dict[tuple[str, str], Sender] = {
    ("ConsumerConfig.opt_start_time", TIME): _put_then_delete(
        _CONSUMER_PATH, '{"deliver_policy": "by_start_time", "opt_start_time": @}'
    ),
    ("ConsumerConfig.pause_until", TIME): _put_then_delete(_CONSUMER_PATH, '{"pause_until": @}'),
    # A pause's end: an RFC 3339 time or a duration (of a consumer only these pause).
    ("PauseRequest.until", TIME): _post(_PAUSED, '{"until": @}'),
    ("PauseRequest.until", DURATION): _post(_PAUSED, '{"until": @}'),
    # A push subscription's pause is its consumer's (PAUSEDSUB: on a consumer of its own).
    ("PauseSubscription.until", TIME): _post("/v1/subscriptions/PAUSEDSUB/pause", '{"until": @}'),
    ("Subscription.timeout", DURATION): _subscription_timeout,
    ("StreamSource.opt_start_time", TIME): _put_then_delete(
        _STREAM_PATH, '{"storage": "memory", "sources": [{"name": "EXT", "opt_start_time": @}]}'
    ),
    ("KVReadRequest.at_time", TIME): _post(
        f"/v1/kv/{BUCKET}/read", '{"keys": ["a"], "at_time": @}'
    ),
    ("MultiRequest.up_to_time", TIME): _post(
        f"/v1/streams/{STREAM}/direct/multi", '{"subjects": ["ext.>"], "up_to_time": @}'
    ),
    ("GET /v1/streams/{stream}/direct?start_time", TIME): _get(
        f"/v1/streams/{STREAM}/direct", "start_time"
    ),
    ("AckItem.delay", DURATION): _post(
        f"/v1/streams/{STREAM}/consumers/{CONSUMER}/ack",
        '{"acks": [{"token": "{token}", "kind": "nak", "delay": @}]}',
    ),
    **{
        (f"ConsumerConfig.{field}", DURATION): _put_then_delete(_CONSUMER_PATH, f'{{"{field}": @}}')
        for field in (
            "ack_wait",
            "inactive_threshold",
            "max_expires",
        )
    },
    ("ConsumerConfig.backoff[]", DURATION): _put_then_delete(
        _CONSUMER_PATH, '{"max_deliver": 5, "backoff": [@, @]}'
    ),
    ("ConsumerConfig.priority_timeout", DURATION): _put_then_delete(
        _CONSUMER_PATH,
        '{"priority_groups": ["g"], "priority_policy": "pinned_client", "priority_timeout": @}',
    ),
    ("ConsumerLimits.inactive_threshold", DURATION): _put_then_delete(
        _STREAM_PATH, f'{{{_SUBJECTS}, "consumer_limits": {{"inactive_threshold": @}}}}'
    ),
    **{
        (f"StreamConfig.{field}", DURATION): _put_then_delete(
            _STREAM_PATH, f'{{{_SUBJECTS}, "{field}": @}}'
        )
        for field in ("max_age", "duplicate_window")
    },
    ("StreamConfig.subject_delete_marker_ttl", DURATION): _put_then_delete(
        _STREAM_PATH,
        f'{{{_SUBJECTS}, "allow_msg_ttl": true, "max_age": 3600, "subject_delete_marker_ttl": @}}',
    ),
    **{
        (f"KVConfig.{field}", DURATION): _put_then_delete("/v1/kv/{name}", f'{{"{field}": @}}')
        for field in ("ttl", "limit_marker_ttl")
    },
    ("ObjConfig.ttl", DURATION): _put_then_delete("/v1/obj/{name}", '{"ttl": @}'),
    ("KVMirrorConfig.ttl", DURATION): _put_then_delete(
        f"/v1/kv/{BUCKET}/mirrors/{{name}}", '{"ttl": @}'
    ),
    **{
        (f"{model}.{field}", DURATION): _post(
            f"/v1/streams/{STREAM}/consumers/{CONSUMER}/{path}",
            f'{{"no_wait": true, "expires": 10, "{field}": @}}'
            if field != "expires"
            else '{"no_wait": true, "expires": @}',
        )
        for (model, path), field in itertools.product(
            [("FetchRequest", "fetch"), ("NextRequest", "next")], ["expires", "idle_heartbeat"]
        )
    },
    **{
        (f"GET /v1/streams/{{stream}}/consumers/{{consumer}}/consume?{name}", DURATION): _consume(
            name
        )
        for name in ("expires", "idle_heartbeat")
    },
    # duration inputs that are plain strings in the spec (they also take "never")
    ("PUT /v1/kv/{bucket}/keys/{key}?ttl", DURATION): _kv_put_ttl,
    ("DELETE /v1/kv/{bucket}/keys/{key}?ttl", DURATION): _kv_purge_ttl,
    ("header Nats-TTL", DURATION): _publish_ttl,
    ("POST /v1/nats/request/{subject}?timeout", DURATION): _core_request_timeout,
    ("PublishItem.headers[Nats-TTL]", DURATION): _publish_batch_ttl,
}
_RAW_TEXT = {
    key
    for key in INPUTS
    if key[0].startswith(("GET ", "PUT ", "DELETE ", "POST ", "header", "PublishItem.headers"))
}


def spec_inputs() -> set[tuple[str, str]]:
    """Every (location, kind) of a time or duration input in the committed spec."""
    spec = json.loads(SPEC.read_text())
    found: set[tuple[str, str]] = set()

    def kind(schema: Any) -> str | None:
        text = json.dumps(schema)
        if '"format": "date-time"' in text:
            return TIME
        if '"format": "go-duration"' in text:
            return DURATION
        return None

    for name, schema in spec["components"]["schemas"].items():
        for field, prop in (schema.get("properties") or {}).items():
            found_kind = kind(prop)
            if found_kind is None:
                continue
            suffix = "[]" if '"type": "array"' in json.dumps(prop) else ""
            found.add((f"{name}.{field}{suffix}", found_kind))
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                found_kind = kind(parameter.get("schema"))
                if found_kind is not None:
                    location = f"{method.upper()} {path}?{parameter['name']}"
                    found.add((location, found_kind))
    return found


def test_every_time_and_duration_of_the_spec_is_covered() -> None:
    found = spec_inputs()
    assert len(found) >= 20, found
    missing = found - set(INPUTS)
    assert not missing, f"time/duration inputs without extremes here: {sorted(missing)}"


# -- the gateway -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, World]]:
    store = tmp_path_factory.mktemp("extremes-store")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    try:
        settings = gateway_settings(server.url, max_fetch_expires=5.0, request_timeout=2.0)
        with served_gateway(settings) as url, httpx.Client(base_url=url, timeout=20) as client:
            world = World(ack_token=_populate(client), names=itertools.count())
            yield client, world
    finally:
        server.stop()


def _ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code < 300, response.text
    return response


def _populate(client: httpx.Client) -> str:
    stream = {"subjects": ["ext.>"], "allow_direct": True, "storage": "memory"}
    _ok(client.put(f"/v1/streams/{STREAM}", json=stream))
    ttl_stream = {"subjects": ["ttl.>"], "allow_msg_ttl": True, "storage": "memory"}
    _ok(client.put(f"/v1/streams/{TTL_STREAM}", json=ttl_stream))
    for i in range(3):
        _ok(client.post(f"/v1/publish/ext.{i}", content=b"x"))
    _ok(client.put(f"/v1/streams/{STREAM}/consumers/{CONSUMER}", json={"ack_wait": "10m"}))
    _ok(client.put(f"/v1/streams/{STREAM}/consumers/PAUSED", json={}))
    subscription = {"stream": STREAM, "consumer": "PAUSEDSUB", "endpoint": _DEAD_END}
    _ok(client.put("/v1/subscriptions/PAUSEDSUB", json=subscription))
    _ok(client.put(f"/v1/kv/{BUCKET}", json={"limit_marker_ttl": 5}))
    _ok(client.put(f"/v1/kv/{BUCKET}/keys/a", content=b"v"))
    fetched = _ok(
        client.post(
            f"/v1/streams/{STREAM}/consumers/{CONSUMER}/fetch",
            json={"max_messages": 1, "expires": 2},
        )
    )
    token: str = fetched.json()["messages"][0]["ack_token"]
    return token


def _check(response: httpx.Response, where: str, value: str) -> None:
    shown = value if len(value) < 120 else value[:100] + f"... ({len(value)} characters)"
    assert response.status_code < 500, (where, shown, response.status_code, response.text[:500])
    if response.status_code >= 400:
        problem = response.headers["content-type"].startswith("application/problem+json")
        assert problem, (where, shown, response.text[:500])
        assert "x-request-id" in response.headers


@pytest.mark.parametrize("location", sorted(INPUTS), ids=lambda key: key[0])
def test_no_5xx_from_extremes(
    location: tuple[str, str], gateway: tuple[httpx.Client, World]
) -> None:
    client, world = gateway
    send = INPUTS[location]
    raw = location in _RAW_TEXT
    if location[1] == TIME:
        values = TIMES if raw else TIME_JSON
    else:
        values = DURATION_TEXTS if raw else DURATIONS

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(values)
    def run(value: str) -> None:
        _check(send(client, value, world), location[0], value)

    run()


@pytest.mark.parametrize(
    "value",
    ["9999-12-31T23:59:59-00:01", "0001-01-01T00:00:00+00:01"],
    ids=["past-9999", "before-1"],
)
def test_out_of_range_times_are_a_400_naming_the_range(
    value: str, gateway: tuple[httpx.Client, World]
) -> None:
    client, _ = gateway
    answers = [
        client.get(f"/v1/streams/{STREAM}/direct", params={"start_time": value}),
        client.post(f"/v1/kv/{BUCKET}/read", json={"keys": ["a"], "at_time": value}),
        client.post(
            f"/v1/streams/{STREAM}/direct/multi", json={"subjects": ["ext.>"], "up_to_time": value}
        ),
        client.put(
            f"/v1/streams/{STREAM}/consumers/T",
            json={"deliver_policy": "by_start_time", "opt_start_time": value},
        ),
        client.put(f"/v1/streams/{STREAM}/consumers/T", json={"pause_until": value}),
    ]
    for response in answers:
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["code"] in ("request.invalid", "consumer.config_invalid"), body
        assert "0001-01-01T00:00:00Z to 9999-12-31" in body["detail"], body
