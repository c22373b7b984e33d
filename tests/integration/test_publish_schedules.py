"""Message schedules (ADR-51) through POST /v1/publish/{subject}: a delayed message reaches its
target when due and not before; malformed schedules are the gateway's 400."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from app.publish import schedules
from tests.helpers import gateway_settings, problem, running_gateway
from tests.integration.test_auth import ADMIN, APP, POLICY, bearer
from tests.integration.test_streams import make_stream

pytestmark = pytest.mark.server("2.12")


async def test_delayed_message(gateway: httpx.AsyncClient, name: str) -> None:
    await make_stream(gateway, name, allow_msg_schedules=True, allow_direct=True)
    base = name.lower()
    target = f"{base}.target"
    due = int(time.time()) + 2
    at = datetime.fromtimestamp(due, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    headers = {
        "Nats-Schedule": f"@at {at}",
        "Nats-Schedule-Target": target,
        "Nats-Header-Order": "42",
    }
    response = await gateway.post(f"/v1/publish/{base}.later.1", content=b"due", headers=headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"stream": name, "seq": 1, "duplicate": False}  # the schedule's

    last = f"/v1/streams/{name}/last/{target}"
    problem(await gateway.get(last), 404)  # not before it is due
    while (found := await gateway.get(last)).status_code == 404:
        assert time.time() < due + 5, "the scheduled message never came"
        await asyncio.sleep(0.1)
    assert time.time() >= due - 0.01
    assert found.status_code == 200 and found.content == b"due"
    assert found.headers["nats-sequence"] != "1"
    message = (await gateway.get(last, headers={"Accept": "application/json"})).json()
    assert message["headers"]["Order"] == ["42"]
    assert message["headers"]["Nats-Schedule-Next"] == ["purge"]


async def test_schedules_checked(
    gateway: httpx.AsyncClient,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    nats_release: tuple[int, int],
) -> None:
    await make_stream(gateway, name, allow_msg_schedules=True)
    base = name.lower()
    subject, target = f"{base}.sched", f"{base}.target"
    later = "@at 2099-01-01T00:00:00Z"
    for headers in (
        {"Nats-Schedule": "@at tomorrow", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "@at 2099-13-01T00:00:00Z", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "@every 10ms", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "@fortnightly", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "0 0 * * *", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "61 0 * * * *", "Nats-Schedule-Target": target},
        {"Nats-Schedule": "0 0 * * 5-2 *", "Nats-Schedule-Target": target},
        {"Nats-Schedule": later},
        {"Nats-Schedule-Target": target},
        {"Nats-Schedule": later, "Nats-Schedule-Target": subject},
        {"Nats-Schedule": later, "Nats-Schedule-Target": f"{base}.*"},
        {"Nats-Schedule": later, "Nats-Schedule-Target": target, "Nats-Schedule-TTL": "1ms"},
        {"Nats-Schedule": later, "Nats-Schedule-Target": target, "Nats-Schedule-Rollup": "all"},
        {
            "Nats-Schedule": later,
            "Nats-Schedule-Target": target,
            "Nats-Schedule-Time-Zone": "Europe/Amsterdam",
        },
        {
            "Nats-Schedule": "0 30 9 * * mon-fri",
            "Nats-Schedule-Target": target,
            "Nats-Schedule-Time-Zone": "+02:00",
        },
    ):
        response = await gateway.post(f"/v1/publish/{subject}", content=b"x", headers=headers)
        problem(response, 400, "schedule.invalid")
    # Well formed, but the target is not in the stream: the server's refusal, mapped.
    elsewhere = {"Nats-Schedule": later, "Nats-Schedule-Target": f"{name}.elsewhere"}
    body = problem(
        await gateway.post(f"/v1/publish/{subject}", headers=elsewhere),
        409,
        "schedule.target_outside",
    )
    assert body["nats"]["err_code"] == 10190
    reserved = {"Nats-Schedule": later, "Nats-Schedule-Target": "$JS.API.INFO"}
    problem(await gateway.post(f"/v1/publish/{subject}", headers=reserved), 403, "subject.reserved")

    for schedule in (later, "@every 1h", "@hourly", "0 30 9 * * mon-fri", "*/15 0-5,7 * ? jan *"):
        headers = {"Nats-Schedule": schedule, "Nats-Schedule-Target": target}
        if not schedule.startswith("@"):
            headers["Nats-Schedule-Time-Zone"] = "Europe/Amsterdam"
        response = await gateway.post(f"/v1/publish/{subject}", content=b"x", headers=headers)
        if nats_release < (2, 14) and schedule != later:
            # 2.12 takes "@at" schedules only (it would call the rest invalid): refused as
            # what the release lacks, before anything is sent.
            refused = problem(response, 501, "nats.feature_unsupported")
            assert refused["detail"].startswith("repeating message schedules"), refused
        else:
            assert response.status_code == 200, (schedule, response.text)
    if nats_release < (2, 14):
        # ... and the headers 2.14 added, which 2.12 would store without a word.
        for more in (
            {"Nats-Schedule-Rollup": "sub"},
            {"Nats-Schedule-Source": f"{base}.source"},
        ):
            headers = {"Nats-Schedule": later, "Nats-Schedule-Target": target, **more}
            response = await gateway.post(f"/v1/publish/{subject}", content=b"x", headers=headers)
            problem(response, 501, "nats.feature_unsupported")
        stored = (await gateway.get(f"/v1/streams/{name}")).json()["state"]["messages"]
        assert stored == 1, stored  # the "@at" schedule alone
    # The headers are checked once per publish (the access checks use that result).
    checks: list[str] = []
    checked = schedules.checked

    def counted(subject: str, headers: dict[str, str]) -> dict[str, str]:
        checks.append(subject)
        return checked(subject, headers)

    monkeypatch.setattr(schedules, "checked", counted)
    headers = {"Nats-Schedule": later, "Nats-Schedule-Target": target}
    response = await gateway.post(f"/v1/publish/{subject}", content=b"x", headers=headers)
    assert response.status_code == 200, response.text
    assert checks == [subject]
    monkeypatch.undo()

    # The same headers in a batch's items; a stream without the flag refuses them.
    plain = f"{name}P"
    await make_stream(gateway, plain)
    item = {
        "subject": f"{plain.lower()}.sched",
        "data": base64.b64encode(b"x").decode(),
        "headers": {"Nats-Schedule": later, "Nats-Schedule-Target": f"{plain.lower()}.t"},
    }
    results = (await gateway.post("/v1/publish", json={"messages": [item]})).json()["results"]
    assert results[0]["error"]["code"] == "schedule.not_allowed"
    problem(
        await gateway.post(f"/v1/publish/{item['subject']}", headers=item["headers"]),
        409,
        "schedule.not_allowed",
    )
    item["headers"] = {"Nats-Schedule": "@every 1ms", "Nats-Schedule-Target": "t"}
    problem(await gateway.post("/v1/publish", json={"messages": [item]}), 400, "schedule.invalid")


async def test_grants_cover_targets_sources_and_batches(
    nats_server: EmbeddedServer, tmp_path: Path, name: str
) -> None:
    """A token that may write part of a stream schedules only into that part, copies only
    what it may read, and its atomic batches stay in it (their refusals without the words of
    JetStream, which could tell of other subjects)."""
    low = name.lower()
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        POLICY.format(admin=ADMIN, app=APP, s=name, lower=low)
        + f'      - {{resource: "stream:{name}/{low}.us.", actions: [write]}}\n'
    )
    async with running_gateway(gateway_settings(nats_server.url, auth_file=auth)) as gw:
        config = {"subjects": [f"{low}.>"], "allow_msg_schedules": True, "allow_atomic": True}
        created = await gw.put(f"/v1/streams/{name}", json=config, headers=bearer(ADMIN))
        assert created.status_code == 201, created.text
        later = "@at 2099-01-01T00:00:00Z"

        def schedule(target: str, **more: str) -> dict[str, str]:
            return {"Nats-Schedule": later, "Nats-Schedule-Target": target, **more, **bearer(APP)}

        url = f"/v1/publish/{low}.eu.sched"
        assert (await gw.post(url, headers=schedule(f"{low}.eu.t"))).status_code == 200
        problem(await gw.post(url, headers=schedule(f"{low}.eu.secret")), 403, "auth.forbidden")
        problem(await gw.post(url, headers=schedule(f"{low}.other")), 403, "auth.forbidden")
        # It may write to .us. but not read it: no copying its messages by a schedule.
        assert (await gw.post(url, headers=schedule(f"{low}.us.t"))).status_code == 200
        copy = schedule(f"{low}.eu.t", **{"Nats-Schedule-Source": f"{low}.us.x"})
        problem(await gw.post(url, headers=copy), 403, "auth.forbidden")

        atomic = "/v1/publish?atomic=true"
        outside = {"messages": [{"subject": f"{low}.eu.a"}, {"subject": f"{low}.other"}]}
        problem(await gw.post(atomic, json=outside, headers=bearer(APP)), 403, "auth.forbidden")
        # Access is decided before the subjects are resolved: a subject of another stream,
        # or of none, is a 403 that names no stream (not publish.batch_streams naming it, or
        # stream.no_match), and comes before the batch's header rules.
        other = f"{name}X"
        made = await gw.put(
            f"/v1/streams/{other}", json={"subjects": [f"{low}x.>"]}, headers=bearer(ADMIN)
        )
        assert made.status_code == 201, made.text
        for subject in (f"{low}x.a", f"{name}nowhere.a"):
            body = {
                "messages": [
                    {"subject": f"{low}.eu.a", "msg_id": "twice"},
                    {"subject": subject, "msg_id": "twice"},
                ]
            }
            refused = problem(await gw.post(atomic, json=body, headers=bearer(APP)), 403)
            assert refused["code"] == "auth.forbidden"
            assert other not in refused["detail"] and "stream" not in refused["detail"]
        inside = {
            "messages": [{"subject": f"{low}.eu.a", "msg_id": "a1"}, {"subject": f"{low}.us.a"}]
        }
        ok = await gw.post(atomic, json=inside, headers=bearer(APP))
        assert ok.status_code == 200, ok.text
        # The ids are the token's own (scoped), so the admin's "a1" is another message...
        admin = await gw.post(atomic, json=inside, headers=bearer(ADMIN))
        assert admin.status_code == 200, admin.text
        # ... and the token's repeat is a duplicate, refused without JetStream's words.
        again = problem(await gw.post(atomic, json=inside, headers=bearer(APP)), 409)
        assert again["code"] == "publish.batch_duplicate"
        assert "description" not in again.get("nats", {})
