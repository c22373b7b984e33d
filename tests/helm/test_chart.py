"""The jsgw chart rendered by Helm's own engine, linted, and validated against Kubernetes."""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from app.auth.policy import load as load_policy
from app.config import Settings
from app.consumers.schemas import ConsumerConfig
from app.push import declared
from app.push.allowlist import DEFAULT_ALLOWED, Allowlist
from app.push.schemas import Subscription
from tests.helm.conftest import NAMESPACE, RELEASE, Render
from tests.helm.manifests import (
    CHART,
    KUBE_VERSION,
    RECOMMENDED_LABELS,
    Doc,
    assert_file_settings_mounted,
    assert_known_env,
    assert_restricted,
    assert_tmp_writable,
    by_kind,
    container,
    env_values,
    mounted_content,
    mounted_files,
    one,
    pod_spec,
    probe_target,
    selector_matches,
    validate_k8s,
)

FULLNAME = f"{RELEASE}-jsgw"
APP_SERVICE = "http://orders.shop.svc.cluster.local:8080/hooks"
TOKENS_FILE = """\
tokens:
  - name: orders-service
    sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
    rules:
      - {resource: "stream:ORDERS", actions: [read, write]}
"""

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "sidecar": {"mode": "sidecar", "nats": {"credsSecret": {"name": "orders-nats-creds"}}},
    "tls": {
        "nats": {
            "url": "tls://nats-0.nats:4222,tls://nats-1.nats:4222",
            "tls": {"enabled": True, "secretName": "nats-client-tls"},
        }
    },
    "tls-ca-only": {
        "nats": {"tls": {"enabled": True, "secretName": "nats-ca", "clientCert": False}}
    },
    "auth": {"auth": {"enabled": True, "tokensFile": TOKENS_FILE}},
    "no-auth": {"auth": {"enabled": False, "allowUnauthenticated": True}},
    "auth-existing-secrets": {
        "auth": {"enabled": True, "existingSecret": "jsgw-tokens", "key": "tokens.json"},
        "ackSecret": {"existingSecret": "jsgw-ack", "key": "hmac"},
        "nats": {"credsSecret": {"name": "jsgw-creds", "key": "user.creds"}},
    },
    "autoscaling": {
        "autoscaling": {
            "enabled": True,
            "minReplicas": 3,
            "maxReplicas": 12,
            "targetMemoryUtilizationPercentage": 80,
        },
    },
    "push": {
        "config": {"pushAllowedUrls": [APP_SERVICE, "http://127.0.0.1:3000"]},
        "subscriptions": {
            "orders": {
                "stream": "ORDERS",
                "consumer": "orders-push",
                "endpoint": f"{APP_SERVICE}/orders",
                "concurrency": 32,
                "timeout": "10s",
                "consumer_config": {
                    "filter_subject": "orders.>",
                    "ack_wait": "30s",
                    "max_deliver": 5,
                    "backoff": ["1s", "5s", "30s"],
                },
                "dead_letter": {"subject": "dlq.orders"},
            },
            "audit": {
                "stream": "AUDIT",
                "consumer": "audit-push",
                "endpoint": "http://127.0.0.1:3000/audit",
                "batch": 50,
                "format": "raw",
            },
        },
    },
    "push-sidecar-list": {
        "mode": "sidecar",
        "subscriptions": [
            {
                "name": "orders",
                "stream": "ORDERS",
                "consumer": "orders-push",
                "endpoint": "http://127.0.0.1:3000/orders",
                "ordered": True,
                "consumer_config": {"priority_timeout": "30s"},
            }
        ],
    },
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Messaging"}},
    },
    "everything": {
        "replicaCount": 3,
        "image": {
            "repository": "registry.example.com/jsgw",
            "tag": "0.1.0-rc1",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "nats": {
            "url": "nats://nats:4222",
            "jsDomain": "hub",
            "credsSecret": {
                "content": "-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n"
            },
        },
        "auth": {"enabled": True, "tokensFile": TOKENS_FILE},
        "ackSecret": {"value": "a-fixed-ack-secret-for-tests"},
        "config": {
            "port": 9090,
            "poolSize": 4,
            "requestTimeout": 2.5,
            "logLevel": "debug",
            "corsOrigins": ["https://a.example", "https://b.example"],
            "workers": 2,
        },
        "extraEnv": [{"name": "JSGW_ACCESS_LOG", "value": "false"}],
        "service": {"type": "NodePort", "port": 80, "annotations": {"team": "platform"}},
        "serviceAccount": {"create": True, "name": "gateway", "annotations": {"x": "y"}},
        "pdb": {"enabled": True, "maxUnavailable": "25%"},
        "serviceMonitor": {
            "enabled": True,
            "interval": "15s",
            "scrapeTimeout": "5s",
            "labels": {"release": "prometheus"},
        },
        "networkPolicy": {
            "enabled": True,
            "ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "orders"}}}],
            "natsEgressTo": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}],
            "natsPorts": [4222, 7422],
        },
        "podAnnotations": {"example.com/owner": "platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "nats", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
    },
}
STANDALONE_SETS = [name for name, values in VALUE_SETS.items() if values.get("mode") != "sidecar"]
# Secrets the value sets name but do not create: they exist in the cluster beforehand.
EXTERNAL_SECRETS = {
    "orders-nats-creds",
    "nats-client-tls",
    "nats-ca",
    "jsgw-tokens",
    "jsgw-ack",
    "jsgw-creds",
}


def settings_configmap(docs: list[Doc]) -> Doc:
    """The ConfigMap of the gateway's settings (the dashboard's, when enabled, is another)."""
    (found,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == FULLNAME]
    return found


@pytest.fixture(params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]


def test_chart_metadata(chart: helm.Chart) -> None:
    meta = chart.metadata
    assert meta["name"] == "jsgw" and meta["apiVersion"] == "v2"
    assert meta["appVersion"] == "0.1.0"
    assert chart.schema is not None


def test_helm_lint(helm_home: Path, value_set: tuple[str, dict[str, Any]]) -> None:
    """`helm lint --strict`: no warnings or errors (only the "icon is recommended" info)."""
    _, values = value_set
    report = helm.lint(
        CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}", namespace=NAMESPACE
    )
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


def test_every_manifest_is_valid_kubernetes(
    render: Render, value_set: tuple[str, dict[str, Any]]
) -> None:
    _, values = value_set
    docs = render(values)
    assert docs
    for doc in docs:
        validate_k8s(doc)
        labels = doc["metadata"]["labels"]
        missing = [label for label in RECOMMENDED_LABELS if label not in labels]
        assert not missing, f"{doc['kind']} lacks {missing}"
        assert labels["app.kubernetes.io/name"] == "jsgw"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "jsgw-0.3.0"


def test_references_resolve(render: Render, value_set: tuple[str, dict[str, Any]]) -> None:
    """Every Secret and ConfigMap the pods use is rendered here or named by the user."""
    _, values = value_set
    docs = render(values)
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")} | EXTERNAL_SECRETS
    configmaps = {d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")}
    if values.get("mode") == "sidecar":
        return  # no pods of its own; test_sidecar_example checks the pods that include it
    spec = pod_spec(one(docs, "Deployment"))
    for volume in spec["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] in secrets, volume
        if "configMap" in volume:
            assert volume["configMap"]["name"] in configmaps, volume
    c = container(spec, "jsgw")
    for source in c.get("envFrom", []):
        assert source["configMapRef"]["name"] in configmaps
    for env in c["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] in secrets, env
            rendered = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == ref["name"]]
            if rendered:
                assert ref["key"] in rendered[0]["data"], (ref, rendered[0]["data"].keys())


@pytest.mark.parametrize("name", STANDALONE_SETS)
def test_standalone_pods(render: Render, name: str) -> None:
    values = VALUE_SETS[name]
    docs = render(values)
    deployment = one(docs, "Deployment")
    spec = pod_spec(deployment)
    c = container(spec, "jsgw")
    env = env_values(c)
    port = values.get("config", {}).get("port", 8080)

    assert env["JSGW_HOST"] == "0.0.0.0"
    assert c["args"] == ["serve"]
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert_restricted(c, spec["securityContext"])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert_tmp_writable(c, spec["volumes"])
    assert_file_settings_mounted(c, spec["volumes"])
    assert {k: probe_target(c[f"{k}Probe"]) for k in ("startup", "readiness", "liveness")} == {
        "startup": ("http", "/healthz"),
        "readiness": ("http", "/readyz"),
        "liveness": ("http", "/healthz"),
    }
    assert all(
        c[f"{k}Probe"]["httpGet"]["port"] == "http" for k in ("startup", "readiness", "liveness")
    )
    assert "restartPolicy" not in c
    assert spec["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]

    # The selector picks this Deployment's pods, and only by the stable labels.
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "jsgw", "app.kubernetes.io/instance": RELEASE}
    assert selector_matches(selector, deployment["spec"]["template"]["metadata"]["labels"])

    service = one(docs, "Service")
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["ports"][0]["port"] == values.get("service", {}).get("port", 8080)


def test_default_values(render: Render, tmp_path: Path) -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    c = container(pod_spec(deployment), "jsgw")
    assert c["image"] == "jsgw:0.1.0"
    assert one(docs, "ConfigMap")["data"] == {
        "JSGW_NATS_URL": "nats://nats:4222",
        "JSGW_PORT": "8080",
        "JSGW_POOL_SIZE": "2",
        "JSGW_REQUEST_TIMEOUT": "5",
        "JSGW_LOG_LEVEL": "info",
        "JSGW_WORKERS": "1",
    }
    # A generated ack secret, shared by all replicas through one Secret.
    secrets = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "Secret")}
    assert len(base64.b64decode(secrets[f"{FULLNAME}-ack"]["ack-secret"])) == 48
    # Auth is on by default, with a generated admin token that the token file accepts.
    assert env_values(c)["JSGW_AUTH_FILE"] == "/etc/jsgw/auth/tokens.yaml"
    token = base64.b64decode(secrets[f"{FULLNAME}-auth"]["admin-token"]).decode()
    tokens_file = tmp_path / "tokens.yaml"
    tokens_file.write_bytes(base64.b64decode(secrets[f"{FULLNAME}-auth"]["tokens.yaml"]))
    assert token not in tokens_file.read_text()  # stored as its digest only
    admin = load_policy(tokens_file).authenticate(token)
    assert admin is not None and admin.name == "admin"
    assert load_policy(tokens_file).authenticate(token + "x") is None
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    # Soft anti-affinity spreads replicas over nodes.
    anti = pod_spec(deployment)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_rendered_settings_are_accepted_by_the_gateway(
    render: Render,
    value_set: tuple[str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ConfigMap and env the chart writes make a valid Settings.

    Mounted files are written under tmp_path: with the content of the Secret the chart
    renders, or a stand-in for a Secret the user provides.
    """
    _, values = value_set
    docs = render(values)
    env: dict[str, str] = dict(settings_configmap(docs)["data"])
    files: dict[str, str] = {}
    if values.get("mode") == "sidecar":
        env["JSGW_HOST"] = "127.0.0.1"  # the sidecar's pods are checked in test_sidecar_example
    else:
        spec = pod_spec(one(docs, "Deployment"))
        c = container(spec, "jsgw")
        for item in c["env"]:
            env[item["name"]] = item.get("value", "secret-from-a-kubernetes-secret")
        for path, volume in mounted_files(c, spec["volumes"]).items():
            content = mounted_content(path, volume, docs)
            files[path] = "x" if content is None else content
        if (
            "JSGW_AUTH_FILE" in env
            and env["JSGW_AUTH_FILE"] in files
            and files[env["JSGW_AUTH_FILE"]] == "x"
        ):
            files[env["JSGW_AUTH_FILE"]] = json.dumps(
                yaml.safe_load(TOKENS_FILE)
            )  # the user's file
    assert_known_env(env)
    for key, value in env.items():
        if value.startswith("/etc/jsgw/"):
            stand_in = tmp_path / value.lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text(files[value])
            env[key] = str(stand_in)
    for key in [k for k in os.environ if k.startswith("JSGW_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # loads the subscriptions file, each endpoint against the allowlist
    assert not settings.embedded
    assert settings.port == values.get("config", {}).get("port", 8080)
    assert settings.listens_on_loopback is (values.get("mode") == "sidecar")
    allowed = values.get("config", {}).get("pushAllowedUrls") or list(DEFAULT_ALLOWED)
    assert settings.push_allowed_urls == allowed
    if values.get("mode") != "sidecar":
        assert (settings.subscriptions is not None) is bool(values.get("subscriptions"))


def test_sidecar_mode_renders_no_workload(render: Render) -> None:
    docs = render(VALUE_SETS["sidecar"])
    # Only what the app's pods mount: the settings, the ack secret and the token file.
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", FULLNAME),
        ("Secret", f"{FULLNAME}-ack"),
        ("Secret", f"{FULLNAME}-auth"),
    ]


def test_sidecar_template_refuses_standalone_mode(tmp_path: Path, helm_home: Path) -> None:
    """jsgw.sidecar fails loudly when the values would also deploy the gateway on its own."""
    parent = _parent_chart(tmp_path, {"jsgw": {"mode": "standalone"}})
    with (
        helm.Chart.load(parent) as loaded,
        pytest.raises(helm.HelmRenderError, match="mode: sidecar"),
    ):
        loaded.render(name=RELEASE)


def _parent_chart(tmp_path: Path, values: dict[str, Any]) -> Path:
    """A minimal app chart with the jsgw chart vendored in charts/ (as `helm dependency build`)."""
    root = tmp_path / "app"
    (root / "templates").mkdir(parents=True)
    shutil.copytree(CHART, root / "charts" / "jsgw")
    (root / "Chart.yaml").write_text(
        "apiVersion: v2\nname: app\nversion: 0.1.0\n"
        "dependencies:\n  - name: jsgw\n    version: 0.3.0\n"
    )
    (root / "values.yaml").write_text(yaml.safe_dump(values))
    (root / "templates" / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\nspec:\n"
        '  initContainers:\n    {{- include "jsgw.sidecar" .Subcharts.jsgw | nindent 4 }}\n'
        "  containers:\n    - name: app\n      image: app:1\n"
        '  volumes:\n    {{- include "jsgw.volumes" .Subcharts.jsgw | nindent 4 }}\n'
    )
    return root


def test_tls(render: Render) -> None:
    c = container(pod_spec(one(render(VALUE_SETS["tls"]), "Deployment")), "jsgw")
    env = env_values(c)
    assert (env["JSGW_NATS_TLS_CA"], env["JSGW_NATS_TLS_CERT"], env["JSGW_NATS_TLS_KEY"]) == (
        "/etc/jsgw/nats-tls/ca.crt",
        "/etc/jsgw/nats-tls/tls.crt",
        "/etc/jsgw/nats-tls/tls.key",
    )
    ca_only = container(pod_spec(one(render(VALUE_SETS["tls-ca-only"]), "Deployment")), "jsgw")
    assert "JSGW_NATS_TLS_CA" in env_values(ca_only)
    assert "JSGW_NATS_TLS_CERT" not in env_values(
        ca_only
    ) and "JSGW_NATS_TLS_KEY" not in env_values(ca_only)


def test_auth(render: Render) -> None:
    docs = render(VALUE_SETS["auth"])
    secret = next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == f"{FULLNAME}-auth")
    assert base64.b64decode(secret["data"]["tokens.yaml"]).decode() == TOKENS_FILE
    c = container(pod_spec(one(docs, "Deployment")), "jsgw")
    assert env_values(c)["JSGW_AUTH_FILE"] == "/etc/jsgw/auth/tokens.yaml"
    assert "admin-token" not in secret["data"]  # the user's tokens only

    docs = render(VALUE_SETS["no-auth"])
    env = env_values(container(pod_spec(one(docs, "Deployment")), "jsgw"))
    assert env["JSGW_ALLOW_UNAUTHENTICATED"] == "true" and "JSGW_AUTH_FILE" not in env
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-auth")]

    docs = render(VALUE_SETS["auth-existing-secrets"])
    assert by_kind(docs, "Secret") == []  # every Secret is the user's
    env = env_values(container(pod_spec(one(docs, "Deployment")), "jsgw"))
    assert env["JSGW_AUTH_FILE"] == "/etc/jsgw/auth/tokens.json"
    assert env["JSGW_ACK_SECRET"] == {"secretKeyRef": {"name": "jsgw-ack", "key": "hmac"}}
    assert env["JSGW_NATS_CREDS"] == "/etc/jsgw/nats-creds/nats.creds"


def test_autoscaling(render: Render) -> None:
    docs = render(VALUE_SETS["autoscaling"])
    deployment = one(docs, "Deployment")
    assert "replicas" not in deployment["spec"]  # the HPA owns the replica count
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    targets = {
        m["resource"]["name"]: m["resource"]["target"]["averageUtilization"]
        for m in hpa["spec"]["metrics"]
    }
    assert targets == {"cpu": 70, "memory": 80}
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_no_pdb_for_a_single_replica(render: Render) -> None:
    assert by_kind(render({"replicaCount": 1}), "PodDisruptionBudget") == []


def test_everything(render: Render) -> None:
    values = VALUE_SETS["everything"]
    docs = render(values)
    deployment = one(docs, "Deployment")
    spec = pod_spec(deployment)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    c = container(spec, "jsgw")
    assert c["image"] == "registry.example.com/jsgw:0.1.0-rc1" and c["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["serviceAccountName"] == "gateway"
    assert (
        spec["nodeSelector"] == values["nodeSelector"]
        and spec["tolerations"] == values["tolerations"]
    )
    assert spec["affinity"] == values["affinity"]
    assert (
        deployment["spec"]["template"]["metadata"]["annotations"]["example.com/owner"] == "platform"
    )
    assert env_values(c)["JSGW_ACCESS_LOG"] == "false"

    data = one(docs, "ConfigMap")["data"]
    assert data["JSGW_CORS_ORIGINS"] == "https://a.example,https://b.example"
    assert (
        data["JSGW_JS_DOMAIN"] == "hub"
        and data["JSGW_WORKERS"] == "2"
        and data["JSGW_PORT"] == "9090"
    )

    secrets = {d["metadata"]["name"]: d for d in by_kind(docs, "Secret")}
    assert (
        base64.b64decode(secrets[f"{FULLNAME}-ack"]["data"]["ack-secret"])
        == b"a-fixed-ack-secret-for-tests"
    )
    assert (
        base64.b64decode(secrets[f"{FULLNAME}-nats-creds"]["data"]["nats.creds"]).decode()
        == (values["nats"]["credsSecret"]["content"])
    )

    assert one(docs, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": "25%",
        "selector": deployment["spec"]["selector"],
    }

    service = one(docs, "Service")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert selector_matches(
        monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        "/metrics",
        "15s",
        "5s",
    )

    policy = one(docs, "NetworkPolicy")
    assert selector_matches(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == values["networkPolicy"]["ingressFrom"]
    assert [p["port"] for p in ingress["ports"]] == ["http"]
    assert "http" in {p["name"] for p in c["ports"]}
    nats_rule, dns_rule = policy["spec"]["egress"]
    assert [p["port"] for p in nats_rule["ports"]] == [4222, 7422]
    assert nats_rule["to"] == values["networkPolicy"]["natsEgressTo"]
    assert sorted((p["port"], p["protocol"]) for p in dns_rule["ports"]) == [
        (53, "TCP"),
        (53, "UDP"),
    ]


def test_config_change_rolls_the_pods(render: Render) -> None:
    def checksum(values: dict[str, Any]) -> str:
        return one(render(values), "Deployment")["spec"]["template"]["metadata"]["annotations"][
            "checksum/jsgw-config"
        ]

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"config": {"logLevel": "debug"}})


SUBSCRIPTIONS_FILE = "/etc/jsgw/subscriptions/subscriptions.yaml"
SUBSCRIPTION = {"stream": "ORDERS", "consumer": "push", "endpoint": "http://127.0.0.1:3000/o"}


def subscriptions_file(docs: list[Doc], tmp_path: Path) -> Path:
    """The subscriptions file the chart renders, written where a test can load it."""
    name = f"{FULLNAME}-subscriptions"
    (configmap,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
    assert list(configmap["data"]) == ["subscriptions.yaml"]
    path = tmp_path / "subscriptions.yaml"
    path.write_text(configmap["data"]["subscriptions.yaml"])
    return path


def test_subscriptions_are_a_mounted_file(render: Render, tmp_path: Path) -> None:
    """values.subscriptions becomes the file JSGW_SUBSCRIPTIONS names, which the gateway's own
    loader accepts with the allowlist the chart sets (and refuses without it)."""
    values = VALUE_SETS["push"]
    docs = render(values)
    spec = pod_spec(one(docs, "Deployment"))
    c = container(spec, "jsgw")
    assert env_values(c)["JSGW_SUBSCRIPTIONS"] == SUBSCRIPTIONS_FILE
    assert_file_settings_mounted(c, spec["volumes"])
    (volume,) = [v for v in spec["volumes"] if v["name"] == "jsgw-subscriptions"]
    assert volume["configMap"]["name"] == f"{FULLNAME}-subscriptions"
    data = settings_configmap(docs)["data"]
    assert data["JSGW_PUSH_ALLOWED_URLS"] == f"{APP_SERVICE},http://127.0.0.1:3000"
    assert "subscriptions.yaml" not in data  # never an environment variable

    path = subscriptions_file(docs, tmp_path)
    assert yaml.safe_load(path.read_text()) == values["subscriptions"]
    loaded = declared.load(path, Allowlist(data["JSGW_PUSH_ALLOWED_URLS"].split(",")))
    assert sorted(loaded) == ["audit", "orders"]
    orders = loaded["orders"]
    assert (orders.endpoint, orders.concurrency, orders.timeout_seconds) == (
        f"{APP_SERVICE}/orders",
        32,
        10.0,
    )
    assert orders.consumer_config is not None and orders.consumer_config.max_deliver == 5
    assert orders.dead_letter is not None and orders.dead_letter.subject == "dlq.orders"
    assert loaded["audit"].batch == 50
    # The Service's URL is outside the gateway's default allowlist (the pod's loopback).
    with pytest.raises(declared.SubscriptionsFileError, match=r"orders.*JSGW_PUSH_ALLOWED_URLS"):
        declared.load(path, Allowlist(DEFAULT_ALLOWED))


def test_subscriptions_as_a_list_in_sidecar_mode(render: Render, tmp_path: Path) -> None:
    docs = render(VALUE_SETS["push-sidecar-list"])
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", FULLNAME),
        ("ConfigMap", f"{FULLNAME}-subscriptions"),
        ("Secret", f"{FULLNAME}-ack"),
        ("Secret", f"{FULLNAME}-auth"),
    ]
    assert "JSGW_PUSH_ALLOWED_URLS" not in settings_configmap(docs)["data"]
    loaded = declared.load(subscriptions_file(docs, tmp_path), Allowlist(DEFAULT_ALLOWED))
    (orders,) = loaded.values()
    assert orders.ordered and orders.endpoint == "http://127.0.0.1:3000/orders"


def test_no_subscriptions_no_file(render: Render) -> None:
    docs = render()
    c = container(pod_spec(one(docs, "Deployment")), "jsgw")
    assert "JSGW_SUBSCRIPTIONS" not in env_values(c)
    assert not [m for m in c["volumeMounts"] if m["name"] == "jsgw-subscriptions"]
    assert [d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")] == [FULLNAME]


def test_a_change_of_subscriptions_rolls_the_pods(render: Render) -> None:
    """The gateway reads the file at start: the pods restart when it changes."""

    def checksum(values: dict[str, Any]) -> str:
        return one(render(values), "Deployment")["spec"]["template"]["metadata"]["annotations"][
            "checksum/jsgw-config"
        ]

    subscriptions = copy.deepcopy(VALUE_SETS["push"]["subscriptions"])
    assert checksum({"subscriptions": subscriptions}) == checksum({"subscriptions": subscriptions})
    before = checksum({"subscriptions": subscriptions})
    subscriptions["orders"]["concurrency"] = 64
    assert checksum({"subscriptions": subscriptions}) != before
    assert checksum({}) != before


def test_the_subscription_schema_is_the_apis() -> None:
    """The chart names the fields PUT /v1/subscriptions/{name} takes, with its limits, and
    those of the ConsumerConfig a consumer is made from."""
    chart = json.loads((CHART / "values.schema.json").read_text())["definitions"]
    api = Subscription.model_json_schema()["properties"]
    assert set(chart["subscription"]["properties"]) == set(Subscription.model_fields)
    assert chart["subscription"]["required"] == Subscription.model_json_schema()["required"]
    named = chart["namedSubscription"]["properties"]
    assert set(named) == {"name", *Subscription.model_fields}
    assert set(chart["consumerConfig"]["properties"]) == set(ConsumerConfig.model_fields)
    for field in ("stream", "consumer", "concurrency", "batch", "format", "ordered", "group"):
        ours = chart["subscription"]["properties"][field]
        for keyword in ("type", "minimum", "maximum", "pattern", "enum"):
            assert ours.get(keyword) == api[field].get(keyword), (field, keyword)


def test_ack_secret_is_generated_per_install(render: Render) -> None:
    def ack(values: dict[str, Any]) -> bytes:
        secret = next(
            d for d in by_kind(render(values), "Secret") if d["metadata"]["name"].endswith("-ack")
        )
        return base64.b64decode(secret["data"]["ack-secret"])

    assert ack({}) != ack({})  # random when not given (and kept from the cluster on upgrade)
    assert ack({"ackSecret": {"value": "fixed"}}) == b"fixed"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auth": {"enabled": False}}, "standalone mode listens on the pod network"),
        ({"nats": {"tls": {"enabled": True}}}, "nats.tls.enabled needs nats.tls.secretName"),
        ({"nats": {"credsSecret": {"name": "a", "content": "b"}}}, "not both"),
        ({"auth": {"enabled": True, "existingSecret": "a", "tokensFile": "b"}}, "not both"),
    ],
)
def test_inconsistent_values_fail_to_render(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values, name=RELEASE)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCont": 3}, "replicaCont"),  # misspelt top-level key
        ({"nats": {"tls": {"enabeld": True}}}, "enabeld"),  # misspelt nested key
        ({"config": {"logLevl": "debug"}}, "logLevl"),
        ({"probes": {"readiness": {"path": "/healthz"}}}, "path"),  # not configurable
        ({"mode": "daemonset"}, "mode"),
        ({"replicaCount": "two"}, "replicaCount"),
        ({"config": {"logLevel": "verbose"}}, "logLevel"),
        ({"nats": {"url": "http://nats:4222"}}, "url"),
        ({"pdb": {"minAvailable": "half"}}, "minAvailable"),
        ({"config": {"pushAllowedUrls": ["ftp://files"]}}, "pushAllowedUrls"),
        ({"subscriptions": {"orders": {"stream": "ORDERS", "consumer": "c"}}}, "endpoint"),
        ({"subscriptions": {"orders": {**SUBSCRIPTION, "endpiont": "x"}}}, "endpiont"),
        ({"subscriptions": {"orders": {**SUBSCRIPTION, "concurrency": 0}}}, "concurrency"),
        ({"subscriptions": {"orders": {**SUBSCRIPTION, "format": "xml"}}}, "format"),
        (
            {"subscriptions": {"orders": {**SUBSCRIPTION, "consumer_config": {"ackwait": 5}}}},
            "ackwait",
        ),
        ({"subscriptions": {"orders": {**SUBSCRIPTION, "dead_letter": {}}}}, "subject"),
        ({"subscriptions": {"or.ders": SUBSCRIPTION}}, "or.ders"),
        ({"subscriptions": [SUBSCRIPTION]}, "name"),  # a list entry names itself
        ({"subscriptions": "orders"}, "subscriptions"),
    ],
)
def test_schema_rejects_bad_values(
    chart: helm.Chart, helm_home: Path, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name=RELEASE)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert any(m["severity"] == 3 and where in m["error"] for m in report["messages"]), report


def test_schema_is_strict_everywhere() -> None:
    """Every object the schema describes field by field forbids other fields."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Doc, path: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '.'} accepts unknown keys"
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}")

    walk(schema, "")
    for name, definition in schema["definitions"].items():
        walk(definition, f"#/definitions/{name}")


def test_values_yaml_is_documented_value_by_value() -> None:
    """Every value in values.yaml has a comment (above or inline); every schema key, a default."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    root = yaml.compose(text)
    undocumented: list[str] = []

    def walk(node: yaml.MappingNode, schema_node: Doc, path: str) -> None:
        keys = {k.value: (k, v) for k, v in node.value}
        for name, child_schema in schema_node["properties"].items():
            if name == "global":
                continue
            assert name in keys, f"{path}{name} is in the schema but has no default in values.yaml"
            key, value = keys[name]
            if child_schema.get("additionalProperties") is False and isinstance(
                value, yaml.MappingNode
            ):
                walk(value, child_schema, f"{path}{name}.")
                continue
            above = lines[key.start_mark.line - 1].strip() if key.start_mark.line else ""
            inline = "#" in lines[key.start_mark.line][value.end_mark.column :]
            if not (above.startswith("#") or inline):
                undocumented.append(f"{path}{name}")

    walk(root, schema, "")
    assert not undocumented, f"values without a comment: {undocumented}"


MONITORING_ON = VALUE_SETS["monitoring"]
DEPLOY = CHART.parents[1] / "deploy"


def test_monitoring_objects_are_off_by_default(render: Render) -> None:
    docs = render()
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert [d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")] == [FULLNAME]


def test_prometheus_rule_holds_the_shipped_rules(render: Render) -> None:
    docs = render(MONITORING_ON)
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == FULLNAME
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "jsgw-rules.yaml").read_text())
    assert rule["spec"] == {"groups": shipped["groups"]}
    # Prometheus's own templates pass through Helm untouched.
    annotations = rule["spec"]["groups"][0]["rules"][0]["annotations"]
    assert "{{ $labels.job }}" in annotations["description"]


def test_dashboard_configmap_holds_the_shipped_dashboard(render: Render) -> None:
    docs = render(MONITORING_ON)
    (dashboard,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] != FULLNAME]
    assert dashboard["metadata"]["name"] == f"{FULLNAME}-dashboard"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Messaging"}
    assert "namespace" not in dashboard["metadata"]
    shipped = json.loads((DEPLOY / "grafana" / "jsgw-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["jsgw-dashboard.json"]) == shipped


def test_dashboard_label_and_namespace_are_optional(render: Render) -> None:
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "sidecarLabel": "",
            "labels": {"dashboards": "jsgw"},
            "namespace": "monitoring",
        }
    }
    docs = render(values)
    (dashboard,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] != FULLNAME]
    assert "grafana_dashboard" not in dashboard["metadata"]["labels"]
    assert dashboard["metadata"]["labels"]["dashboards"] == "jsgw"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    for doc in docs:
        validate_k8s(doc)


def test_monitoring_objects_are_standalone_only(render: Render) -> None:
    docs = render({**VALUE_SETS["sidecar"], **MONITORING_ON})
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert all(d["metadata"]["name"] != f"{FULLNAME}-dashboard" for d in docs)


def test_the_chart_ships_the_deploy_files() -> None:
    for shipped in (
        DEPLOY / "prometheus" / "jsgw-rules.yaml",
        DEPLOY / "grafana" / "jsgw-dashboard.json",
    ):
        assert (CHART / "files" / shipped.name).read_bytes() == shipped.read_bytes(), (
            f"helm/jsgw/files/{shipped.name} differs from {shipped.relative_to(CHART.parents[1])}"
        )
