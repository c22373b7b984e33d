"""subject: rules for core NATS: write for publish and request, read for subscribe, default
deny, and subscriptions narrowed to what the token may read."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import orjson
import pytest
from nats.aio.msg import Msg

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, problem, served_gateway
from tests.integration.test_core_nats import heard
from tests.integration.test_core_nats_subscribe import subscribed

READER = "reader-token-0123456789"
WRITER = "writer-token-0123456789"
STREAMS = "streams-token-012345678"
ALL = "all-subjects-token-0123"
POLICY = """
tokens:
  - name: reader
    token: "{reader}"
    rules:
      - {{resource: "subject:{n}.eu.", actions: [read]}}
      - {{resource: "subject:{n}.eu.secret", actions: []}}
  - name: writer
    token: "{writer}"
    rules:
      - {{resource: "subject:{n}.svc.", actions: [write]}}
  - name: streams
    token: "{streams}"
    rules:
      - {{resource: "stream:*", actions: [read, write, admin]}}
      - {{resource: "kv:*", actions: [read, write, admin]}}
  - name: all
    token: "{all}"
    rules:
      - {{resource: "subject:*", actions: [read, write]}}
  - name: all-but-a-stream
    token: "{walled}"
    rules:
      - {{resource: "subject:*", actions: [read, write]}}
      - {{resource: "stream:{n}_WALLED", actions: []}}
      - {{resource: "stream:{n}_OPEN", actions: [read, write]}}
"""
WALLED = "walled-token-0123456789"


class Refusals:
    """GETs of subscriptions that should be refused: a stream that starts instead fails the
    test at once rather than waiting for an end that never comes."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        async with self.client.stream("GET", url, **kwargs) as response:
            assert response.status_code != 200, f"{url} was not refused"
            await response.aread()
            return response


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def served(nats_server: EmbeddedServer, tmp_path: Path, name: str) -> Iterator[str]:
    path = tmp_path / "auth.yaml"
    path.write_text(
        POLICY.format(reader=READER, writer=WRITER, streams=STREAMS, all=ALL, walled=WALLED, n=name)
    )
    settings = gateway_settings(nats_server.url, auth_file=path, sse_heartbeat=0.5)
    with served_gateway(settings) as url:
        yield url


async def test_publish_and_request_need_write_on_the_subject(
    served: str, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    async def respond(msg: Msg) -> None:
        await nc.publish(msg.reply, b"pong")

    await nc.subscribe(f"{name}.>", cb=respond)
    await nc.flush()
    for subject in (f"{name}.svc.a", f"{name}.svc.b"):
        await heard(nats_server, subject)
    async with httpx.AsyncClient(base_url=served, timeout=10) as http:
        for route in ("publish", "request"):
            problem(await http.post(f"/v1/nats/{route}/{name}.svc.a", content=b"x"), 401)
            ok = await http.post(
                f"/v1/nats/{route}/{name}.svc.a", content=b"x", headers=bearer(WRITER)
            )
            assert ok.status_code == (202 if route == "publish" else 200), ok.text
            for token in (WRITER, READER, STREAMS):  # other subjects, read, stream grants
                problem(
                    await http.post(
                        f"/v1/nats/{route}/{name}.eu.a", content=b"x", headers=bearer(token)
                    ),
                    403,
                    "auth.forbidden",
                )
            # Reserved namespaces stay refused whatever the grant.
            problem(
                await http.post(f"/v1/nats/{route}/$JS.API.INFO", content=b"", headers=bearer(ALL)),
                400,
                "nats.subject_reserved",
            )
        request = await http.post(
            f"/v1/nats/request/{name}.svc.b", content=b"x", headers=bearer(WRITER)
        )
        assert request.content == b"pong"


async def test_a_wildcard_subscription_is_narrowed_to_what_the_token_may_read(
    served: str, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    subjects = [
        f"{name}.us.1",
        f"{name}.eu.1",
        f"{name}.eu.secret.x",  # carved out of the grant
        f"{name}.europe.1",  # "eu." is a whole token
        f"{name}.eu.2",
    ]
    async with (
        httpx.AsyncClient(base_url=served, timeout=10) as http,
        subscribed(
            http, f"{name}.>", bearer(READER), settle=(nats_server.url, f"{name}.eu.probe")
        ) as narrowed,
        subscribed(
            http, f"{name}.>", bearer(ALL), settle=(nats_server.url, f"{name}.all.probe")
        ) as everything,
    ):
        for subject in subjects:
            await nc.publish(subject, subject.encode())
        await nc.flush()
        every = [orjson.loads((await everything.next()).data) for _ in subjects]
        seen = [orjson.loads((await narrowed.next()).data) for _ in range(2)]
        with pytest.raises(TimeoutError):
            await narrowed.next(timeout=0.5)
    assert [m["subject"] for m in every] == subjects
    assert [m["subject"] for m in seen] == [f"{name}.eu.1", f"{name}.eu.2"]
    assert [base64.b64decode(m["data"]).decode() for m in seen] == [m["subject"] for m in seen]


async def test_subscriptions_the_token_may_read_nothing_of_are_refused(
    served: str, name: str
) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=10) as client:
        http = Refusals(client)
        url = f"/v1/nats/subscribe/{name}.us.>"
        problem(await http.get(url), 401)
        for token in (READER, WRITER, STREAMS):
            problem(await http.get(url, headers=bearer(token)), 403, "auth.forbidden")
        problem(
            await http.get(f"/v1/nats/subscribe/{name}.eu.secret.>", headers=bearer(READER)),
            403,
            "auth.forbidden",
        )


async def test_a_queue_group_member_must_read_the_whole_filter(
    served: str, nc: nats.NATS, nats_server: EmbeddedServer, name: str
) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=10) as client:
        http = Refusals(client)
        # Narrowing would drop messages that the group's other members then never get.
        body = problem(
            await http.get(
                f"/v1/nats/subscribe/{name}.>", params={"queue": "q"}, headers=bearer(READER)
            ),
            403,
            "auth.forbidden",
        )
        assert "queue group" in body["detail"]
        problem(
            await http.get(
                f"/v1/nats/subscribe/{name}.eu.>", params={"queue": "q"}, headers=bearer(READER)
            ),
            403,
        )  # eu.secret. is carved out
        settle = (nats_server.url, f"{name}.eu.1")
        async with subscribed(
            client, f"{name}.eu.1", bearer(READER), settle=settle, queue="q"
        ) as events:
            await nc.publish(f"{name}.eu.1", b"x")
            assert orjson.loads((await events.next()).data)["subject"] == f"{name}.eu.1"


async def test_a_stream_rule_that_denies_holds_against_core_nats(
    served: str, nc: nats.NATS, name: str
) -> None:
    """What core NATS publishes on a subject a stream captures is stored there, and a
    subscription there reads that stream's traffic: a stream rule of the token that denies
    it decides, whatever its subject: rules grant. A stream its rules allow, or one none of
    them names, is left to the subject: rules."""
    js = nc.jetstream()
    await js.add_stream(name=f"{name}_WALLED", subjects=[f"{name}.walled.>"])
    await js.add_stream(name=f"{name}_OPEN", subjects=[f"{name}.open.>"])
    await js.add_stream(name=f"{name}_OTHER", subjects=[f"{name}.other.>"])
    async with httpx.AsyncClient(base_url=served, timeout=10, headers=bearer(WALLED)) as http:
        for path in (f"publish/{name}.walled.x", f"request/{name}.walled.x"):
            refused = await http.post(f"/v1/nats/{path}", content=b"in")
            assert problem(refused, 403)["code"] == "auth.forbidden"
        subscribe = Refusals(http)
        for filter_subject in (f"{name}.walled.x", f"{name}.>"):  # (the second meets it)
            refused = await subscribe.get(f"/v1/nats/subscribe/{filter_subject}")
            assert refused.status_code == 403, refused.text
        for stream in ("open", "other"):
            published = await http.post(f"/v1/nats/publish/{name}.{stream}.x", content=b"in")
            assert published.status_code == 202, published.text
        async with subscribed(http, f"{name}.open.>"):
            pass
    assert (await js.stream_info(f"{name}_WALLED")).state.messages == 0
    assert (await js.stream_info(f"{name}_OPEN")).state.messages == 1
    assert (await js.stream_info(f"{name}_OTHER")).state.messages == 1
