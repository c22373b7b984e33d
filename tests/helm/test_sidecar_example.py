"""deploy/helm-sidecar-example: an app chart that adds jsgw to its pods as a native sidecar.

The example depends on helm/jsgw through a file:// dependency; the tests copy both charts
to a temporary tree and run `helm dependency build` there (offline), as an operator would.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from app.config import Settings
from app.push import declared
from app.push.allowlist import DEFAULT_ALLOWED, Allowlist
from tests.helm.conftest import RELEASE, rendered_docs
from tests.helm.manifests import (
    CHART,
    KUBE_VERSION,
    RECOMMENDED_LABELS,
    REPO,
    SIDECAR_EXAMPLE,
    Doc,
    assert_file_settings_mounted,
    assert_known_env,
    assert_restricted,
    assert_tmp_writable,
    by_kind,
    container,
    env_values,
    one,
    pod_spec,
    probe_target,
    validate_k8s,
)
from tests.helm.probes import run_probe, stub_server

FULLNAME = f"{RELEASE}-jsgw"


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory: pytest.TempPathFactory, helm_home: Path) -> Path:
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("charts", "Chart.lock")
    for source in (CHART, SIDECAR_EXAMPLE):
        shutil.copytree(source, root / source.relative_to(REPO), ignore=ignore)
    example = root / SIDECAR_EXAMPLE.relative_to(REPO)
    assert [d["status"] for d in helm.dependency_list(example)] == ["missing"]
    helm.dependency_build(example)
    return example


@pytest.fixture(scope="module")
def example(example_dir: Path) -> Iterator[helm.Chart]:
    with helm.Chart.load(example_dir) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def docs(example: helm.Chart) -> list[Doc]:
    return rendered_docs(example)


def sidecar_of(docs: list[Doc]) -> tuple[Doc, Doc]:
    spec = pod_spec(one(docs, "Deployment"))
    return spec, container(spec, "jsgw", init=True)


def test_dependency_resolves_to_this_repositorys_chart(
    example_dir: Path, example: helm.Chart
) -> None:
    (dep,) = helm.dependency_list(example_dir)
    assert dep["status"] == "ok" and dep["repository"] == "file://../../helm/jsgw"
    (loaded,) = example.dependencies
    assert (loaded["name"], loaded["version"]) == ("jsgw", helm.Chart.load(CHART).version)


def test_helm_lint(example_dir: Path) -> None:
    """The app chart, rendered with its jsgw dependency (linted on its own in test_chart)."""
    report = helm.lint(example_dir, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


def test_manifests_are_valid_kubernetes(docs: list[Doc]) -> None:
    for doc in docs:
        validate_k8s(doc)
    for doc in docs:
        if doc["metadata"]["name"].startswith(FULLNAME):  # the jsgw chart's own objects
            assert all(label in doc["metadata"]["labels"] for label in RECOMMENDED_LABELS), doc[
                "metadata"
            ]


def test_only_the_apps_workload_is_rendered(docs: list[Doc]) -> None:
    """In sidecar mode the jsgw chart adds configuration, not a Deployment or Service."""
    assert [d["metadata"]["name"] for d in by_kind(docs, "Deployment")] == [f"{RELEASE}-orders-app"]
    assert by_kind(docs, "Service") == [] and by_kind(docs, "ServiceAccount") == []
    assert sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "Deployment"
    ) == [
        ("ConfigMap", FULLNAME),
        ("ConfigMap", f"{FULLNAME}-subscriptions"),
        ("ConfigMap", f"{RELEASE}-orders-app-code"),
        ("Secret", f"{FULLNAME}-ack"),
    ]


def test_native_sidecar(docs: list[Doc]) -> None:
    spec, c = sidecar_of(docs)
    assert [i["name"] for i in spec["initContainers"]] == ["jsgw"]
    assert "jsgw" not in [x["name"] for x in spec["containers"]]
    assert c["restartPolicy"] == "Always"  # what makes an init container a sidecar
    env = env_values(c)
    assert env["JSGW_HOST"] == "127.0.0.1"
    assert "JSGW_ALLOW_UNAUTHENTICATED" not in env and "JSGW_AUTH_FILE" not in env
    assert_restricted(c, spec.get("securityContext"))  # on its own: the pod is the app's
    assert_tmp_writable(c, spec["volumes"])
    assert_file_settings_mounted(c, spec["volumes"])
    assert {k: probe_target(c[f"{k}Probe"])[0] for k in ("startup", "readiness", "liveness")} == {
        "startup": "exec",
        "readiness": "exec",
        "liveness": "exec",
    }

    # The app reaches the gateway on localhost, at the port the gateway listens on.
    app = container(spec, "app")
    (port,) = [p["containerPort"] for p in c["ports"]]
    assert env_values(app)["JSGW_URL"] == f"http://127.0.0.1:{port}"
    assert_restricted(app, spec.get("securityContext"))


def test_the_sidecar_pushes_orders_to_the_app(docs: list[Doc], tmp_path: Path) -> None:
    """The subscription of the values is a file the gateway loads (with its default
    allowlist: the pod's loopback), whose endpoint is where the app listens; the app's code
    is files/orders_app.py, mounted where its command runs it."""
    spec, c = sidecar_of(docs)
    configmaps = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    path = tmp_path / "subscriptions.yaml"
    path.write_text(configmaps[f"{FULLNAME}-subscriptions"]["subscriptions.yaml"])
    (orders,) = declared.load(path, Allowlist(DEFAULT_ALLOWED)).values()
    assert env_values(c)["JSGW_SUBSCRIPTIONS"] == "/etc/jsgw/subscriptions/subscriptions.yaml"

    app = container(spec, "app")
    assert orders.endpoint == f"http://127.0.0.1:{env_values(app)['PORT']}/orders"
    assert orders.dead_letter is not None and orders.consumer_config is not None
    code = configmaps[f"{RELEASE}-orders-app-code"]["orders_app.py"]
    assert code == (SIDECAR_EXAMPLE / "files" / "orders_app.py").read_text()
    (mount,) = app["volumeMounts"]
    assert app["command"] == ["python", f"{mount['mountPath']}/orders_app.py"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == f"{RELEASE}-orders-app-code"


def test_sidecar_references_the_subcharts_objects(docs: list[Doc]) -> None:
    """.Subcharts.jsgw gives the sidecar the same names as the Secrets the subchart renders."""
    spec, c = sidecar_of(docs)
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    secrets = {d["metadata"]["name"]: d for d in by_kind(docs, "Secret")}
    assert [s["configMapRef"]["name"] for s in c["envFrom"]] == [FULLNAME]
    assert FULLNAME in configmaps
    ack = env_values(c)["JSGW_ACK_SECRET"]["secretKeyRef"]
    assert ack["key"] in secrets[ack["name"]]["data"]
    # The NATS creds Secret is the operator's; values.yaml says how to create it.
    (creds,) = [v for v in spec["volumes"] if v["name"] == "jsgw-nats-creds"]
    name = creds["secret"]["secretName"]
    assert name not in secrets
    assert f"kubectl create secret generic {name}" in (SIDECAR_EXAMPLE / "values.yaml").read_text()
    assert env_values(c)["JSGW_NATS_CREDS"] == "/etc/jsgw/nats-creds/nats.creds"
    # No volume name clashes between the app's and the gateway's.
    names = [v["name"] for v in spec["volumes"]]
    assert len(names) == len(set(names))


def test_gateway_accepts_the_rendered_settings(
    docs: list[Doc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, c = sidecar_of(docs)
    configmaps = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    env = dict(configmaps[FULLNAME])
    env.update({e["name"]: e.get("value", "from-a-secret") for e in c["env"]})
    assert_known_env(env)
    creds = tmp_path / "nats.creds"
    creds.write_text("stand-in for the operator's creds file")
    env["JSGW_NATS_CREDS"] = str(creds)
    subscriptions = tmp_path / "subscriptions.yaml"
    subscriptions.write_text(configmaps[f"{FULLNAME}-subscriptions"]["subscriptions.yaml"])
    env["JSGW_SUBSCRIPTIONS"] = str(subscriptions)
    for key in [k for k in os.environ if k.startswith("JSGW_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # loads the subscriptions file (each endpoint against the allowlist)
    assert settings.listens_on_loopback and settings.nats_creds == creds
    assert settings.subscriptions == subscriptions
    assert settings.nats_url == ["nats://nats.nats.svc.cluster.local:4222"]


def test_probes_work_against_a_loopback_server(example: helm.Chart) -> None:
    """Run the rendered exec probes: they pass on 200 and fail on 503 or nothing listening."""
    with stub_server() as server:
        docs = rendered_docs(example, {"jsgw": {"config": {"port": server.port}}})
        _, c = sidecar_of(docs)
        probes = {
            k: c[f"{k}Probe"]["exec"]["command"] for k in ("startup", "readiness", "liveness")
        }
        assert all(run_probe(cmd) == 0 for cmd in probes.values())
        assert sorted(server.requests) == ["/healthz", "/healthz", "/readyz"]

        server.statuses["/readyz"] = 503  # NATS down: not ready, but alive
        assert run_probe(probes["readiness"]) != 0
        assert run_probe(probes["liveness"]) == 0 and run_probe(probes["startup"]) == 0
    assert run_probe(probes["liveness"]) != 0  # nothing listens any more


def test_config_change_rolls_the_apps_pods(example: helm.Chart) -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        deployment = one(rendered_docs(example, values), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/jsgw-config"]

    assert checksum(None) == checksum(None)
    assert checksum(None) != checksum({"jsgw": {"config": {"poolSize": 4}}})


def test_sidecar_with_auth_tls_and_generated_secrets(example: helm.Chart, tmp_path: Path) -> None:
    docs = rendered_docs(
        example,
        {
            "jsgw": {
                "auth": {"enabled": True},
                "ackSecret": {"value": "shared-by-every-pod"},
                "nats": {
                    "url": "tls://nats:4222",
                    "tls": {"enabled": True, "secretName": "nats-tls"},
                },
            }
        },
    )
    for doc in docs:
        validate_k8s(doc)
    spec, c = sidecar_of(docs)
    assert_file_settings_mounted(c, spec["volumes"])
    secrets = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "Secret")}
    assert base64.b64decode(secrets[f"{FULLNAME}-ack"]["ack-secret"]) == b"shared-by-every-pod"
    token = base64.b64decode(secrets[f"{FULLNAME}-auth"]["admin-token"])
    tokens = yaml.safe_load(base64.b64decode(secrets[f"{FULLNAME}-auth"]["tokens.yaml"]))
    assert tokens["tokens"][0]["sha256"] == hashlib.sha256(token).hexdigest()
    (auth,) = [v for v in spec["volumes"] if v["name"] == "jsgw-auth"]
    assert auth["secret"]["defaultMode"] == 0o444  # the app's pod has no fsGroup for UID 10001
