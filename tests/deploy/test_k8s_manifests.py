"""deploy/k8s: plain manifests for the sidecar and standalone layouts, validated offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.push import declared
from app.push.allowlist import DEFAULT_ALLOWED, Allowlist
from tests.helm.manifests import (
    REPO,
    Doc,
    assert_file_settings_mounted,
    assert_known_env,
    assert_restricted,
    assert_tmp_writable,
    container,
    env_values,
    load_yaml_docs,
    one,
    pod_spec,
    probe_target,
    selector_matches,
    validate_k8s,
)
from tests.helm.probes import run_probe, stub_server

K8S = REPO / "deploy" / "k8s"


def read(name: str) -> str:
    return (K8S / name).read_text()


def docs_of(name: str) -> list[Doc]:
    return load_yaml_docs(read(name))


def secrets_created_in_comments(name: str) -> set[str]:
    """The Secrets the header comment tells the operator to create."""
    return set(re.findall(r"kubectl create secret generic (\S+)", (K8S / name).read_text()))


def referenced_secrets(spec: Doc) -> set[str]:
    names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for c in spec.get("initContainers", []) + spec["containers"]:
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
    return names


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml")))
def test_valid_kubernetes(name: str) -> None:
    docs = docs_of(name)
    assert docs
    for doc in docs:
        validate_k8s(doc)


def test_validation_is_strict() -> None:
    doc = one(docs_of("standalone.yaml"), "Deployment")
    container(pod_spec(doc), "jsgw")["readOnlyRootFilesytem"] = True
    with pytest.raises(AssertionError, match="readOnlyRootFilesytem"):
        validate_k8s(doc)


def test_sidecar() -> None:
    deployment = one(docs_of("sidecar.yaml"), "Deployment")
    spec = pod_spec(deployment)
    gateway = container(spec, "jsgw", init=True)
    assert gateway["restartPolicy"] == "Always"
    env = env_values(gateway)
    assert_known_env(env)
    assert env["JSGW_HOST"] == "127.0.0.1"
    assert env["JSGW_NATS_URL"].startswith("nats://")
    assert env["JSGW_NATS_CREDS"] == "/etc/jsgw/nats-creds/nats.creds"
    assert "secretKeyRef" in env["JSGW_ACK_SECRET"]
    assert_restricted(gateway, spec["securityContext"])
    assert_tmp_writable(gateway, spec["volumes"])
    # The creds Secret is mounted whole (no items): its key must be the file name.
    (creds,) = [v for v in spec["volumes"] if v["name"] == "jsgw-nats-creds"]
    assert "items" not in creds["secret"]
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == "jsgw-nats-creds")
    assert (
        env["JSGW_NATS_CREDS"] == f"{mount['mountPath']}/nats.creds" and mount["readOnly"] is True
    )
    assert "--from-file=nats.creds=" in (K8S / "sidecar.yaml").read_text()
    # The app reaches the gateway over loopback, on its port.
    app = container(spec, "app")
    (port,) = [p["containerPort"] for p in gateway["ports"]]
    assert env_values(app)["JSGW_URL"] == f"http://127.0.0.1:{port}" and env["JSGW_PORT"] == str(
        port
    )
    assert referenced_secrets(spec) == secrets_created_in_comments("sidecar.yaml")


def test_sidecar_pushes_to_the_app(tmp_path: Path) -> None:
    """The subscriptions ConfigMap is the file JSGW_SUBSCRIPTIONS names, the gateway's own
    loader accepts it with the default allowlist, and its endpoint is where the app listens:
    the example application of the sidecar chart, from the ConfigMap the header creates."""
    docs = docs_of("sidecar.yaml")
    spec = pod_spec(one(docs, "Deployment"))
    gateway, app = container(spec, "jsgw", init=True), container(spec, "app")
    env = env_values(gateway)
    assert "JSGW_PUSH_ALLOWED_URLS" not in env
    volumes = {v["name"]: v for v in spec["volumes"]}
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == "jsgw-subscriptions")
    assert volumes["jsgw-subscriptions"]["configMap"]["name"] == configmap["metadata"]["name"]
    # (mounted whole: each key of the ConfigMap, and the creds Secret's key, is a file)
    files = [f"{mount['mountPath']}/{key}" for key in configmap["data"]]
    assert_file_settings_mounted(gateway, spec["volumes"], [*files, env["JSGW_NATS_CREDS"]])
    assert env["JSGW_SUBSCRIPTIONS"] == f"{mount['mountPath']}/subscriptions.yaml"
    path = tmp_path / "subscriptions.yaml"
    path.write_text(configmap["data"]["subscriptions.yaml"])
    (orders,) = declared.load(path, Allowlist(DEFAULT_ALLOWED)).values()
    assert orders.endpoint == f"http://127.0.0.1:{env_values(app)['PORT']}/orders"
    assert orders.dead_letter is not None
    # The app's code: the chart example's, in the ConfigMap the header tells how to create.
    code = next(m for m in app["volumeMounts"] if m["name"] == "app-code")
    assert app["command"] == ["python", f"{code['mountPath']}/orders_app.py"]
    created = re.findall(r"kubectl create configmap (\S+) --from-file=(\S+)", read("sidecar.yaml"))
    assert created == [
        (
            volumes["app-code"]["configMap"]["name"],
            "deploy/helm-sidecar-example/files/orders_app.py",
        )
    ]
    assert (REPO / created[0][1]).is_file()


def test_sidecar_probes_run_inside_the_pod() -> None:
    """Loopback-only: the probes are commands in the container, and they work."""
    gateway = container(pod_spec(one(docs_of("sidecar.yaml"), "Deployment")), "jsgw", init=True)
    probes = {
        k: gateway[f"{k}Probe"]["exec"]["command"] for k in ("startup", "readiness", "liveness")
    }
    assert {k: "/readyz" in " ".join(c) for k, c in probes.items()} == {
        "startup": False,
        "readiness": True,
        "liveness": False,
    }
    with stub_server() as server:
        rewritten = {
            k: [a.replace("127.0.0.1:8080", f"127.0.0.1:{server.port}") for a in c]
            for k, c in probes.items()
        }
        assert all(run_probe(c) == 0 for c in rewritten.values())
        server.statuses["/readyz"] = 503
        assert run_probe(rewritten["readiness"]) != 0 and run_probe(rewritten["liveness"]) == 0


def test_standalone() -> None:
    docs = docs_of("standalone.yaml")
    deployment, service = one(docs, "Deployment"), one(docs, "Service")
    spec = pod_spec(deployment)
    gateway = container(spec, "jsgw")
    env = env_values(gateway)
    assert_known_env(env)
    assert env["JSGW_HOST"] == "0.0.0.0"
    assert env["JSGW_AUTH_FILE"]  # on the pod network: authenticated
    assert_restricted(gateway, spec["securityContext"])
    assert_tmp_writable(gateway, spec["volumes"])
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    whole_secret_files = [f"{mounts['nats-creds']}/nats.creds", f"{mounts['auth']}/tokens.yaml"]
    assert_file_settings_mounted(gateway, spec["volumes"], whole_secret_files)
    assert "--from-file=tokens.yaml=" in (K8S / "standalone.yaml").read_text()
    assert {
        k: probe_target(gateway[f"{k}Probe"]) for k in ("startup", "readiness", "liveness")
    } == {
        "startup": ("http", "/healthz"),
        "readiness": ("http", "/readyz"),
        "liveness": ("http", "/healthz"),
    }
    assert selector_matches(
        service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    assert selector_matches(
        deployment["spec"]["selector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"],
    )
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in gateway["ports"]}
    assert referenced_secrets(spec) == secrets_created_in_comments("standalone.yaml")
