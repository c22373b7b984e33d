"""Checks shared by the chart, sidecar-example and plain-manifest tests.

Manifests are validated offline against the Kubernetes OpenAPI schemas that
kubernetes-validate ships, in strict mode (unknown fields are errors).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from app.config import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "jsgw"
SIDECAR_EXAMPLE = REPO / "deploy" / "helm-sidecar-example"

# kubernetes-validate 1.37 ships schemas for 1.25 … 1.37. Pinned to 1.33, the release in
# which native sidecars (initContainers with restartPolicy: Always) went GA.
KUBE_VERSION = "1.33.0"

# Kinds whose schemas are CRDs that kubernetes-validate does not ship; their tests check
# them field by field instead.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")

Doc = dict[str, Any]


def load_yaml_docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def validate_k8s(doc: Doc) -> None:
    """Strict schema validation, plus what the schemas leave out (names, label values)."""
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(f"{where}: {path}: {exc.message}") from None
    name = doc["metadata"]["name"]
    assert _DNS_SUBDOMAIN.match(name), f"{where}: invalid name {name!r}"
    for labels in _all_labels(doc):
        for key, value in labels.items():
            assert isinstance(value, str) and _LABEL_VALUE.match(value), (
                f"{where}: label {key}={value!r} is not a valid label value"
            )


def _all_labels(doc: Doc) -> Iterator[dict[str, Any]]:
    yield doc["metadata"].get("labels") or {}
    template = doc.get("spec", {}).get("template")
    if isinstance(template, dict):
        yield template.get("metadata", {}).get("labels") or {}


def by_kind(docs: Iterable[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: Iterable[Doc], kind: str) -> Doc:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]


def container(spec: Doc, name: str, *, init: bool = False) -> Doc:
    items = spec.get("initContainers" if init else "containers") or []
    matches = [c for c in items if c["name"] == name]
    assert len(matches) == 1, f"no single container {name!r} in {[c['name'] for c in items]}"
    return matches[0]


def env_values(c: Doc) -> dict[str, Any]:
    """Container env as name -> value (plain values) or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def settings_env_names() -> set[str]:
    """Every variable the gateway reads: JSGW_ + a Settings field name."""
    return {f"JSGW_{name.upper()}" for name in Settings.model_fields}


def assert_known_env(names: Iterable[str]) -> None:
    unknown = {n for n in names if n.startswith("JSGW_")} - settings_env_names()
    assert not unknown, f"variables the gateway does not read: {sorted(unknown)}"


def assert_restricted(c: Doc, pod_security: Doc | None = None) -> None:
    """The container meets the "restricted" Pod Security Standard on its own or with its pod."""
    sc = c.get("securityContext") or {}
    pod = pod_security or {}
    assert sc.get("allowPrivilegeEscalation") is False, c["name"]
    assert sc.get("readOnlyRootFilesystem") is True, c["name"]
    assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
    assert not sc.get("capabilities", {}).get("add"), c["name"]
    assert sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, c["name"]
    assert sc.get("runAsUser", pod.get("runAsUser", 1)) != 0, c["name"]
    seccomp = sc.get("seccompProfile", pod.get("seccompProfile")) or {}
    assert seccomp.get("type") == "RuntimeDefault", c["name"]


def mounted_files(c: Doc, volumes: list[Doc]) -> dict[str, Doc]:
    """Paths of the files the container sees from Secret and ConfigMap volumes -> their
    volume."""
    by_name = {v["name"]: v for v in volumes}
    files: dict[str, Doc] = {}
    for mount in c.get("volumeMounts", []):
        volume = by_name.get(mount["name"])
        assert volume is not None, f"{c['name']} mounts an undefined volume {mount['name']!r}"
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        assert mount.get("readOnly") is True, f"volume {mount['name']} mounted writable"
        for item in source.get("items") or []:
            files[f"{mount['mountPath'].rstrip('/')}/{item['path']}"] = volume
    return files


def mounted_content(path: str, volume: Doc, docs: list[Doc]) -> str | None:
    """The content of a mounted file when this render holds its Secret or ConfigMap (None
    for one the user provides)."""
    if "secret" in volume:
        kind, name, items = "Secret", volume["secret"]["secretName"], volume["secret"]["items"]
    else:
        kind, name, items = "ConfigMap", volume["configMap"]["name"], volume["configMap"]["items"]
    (item,) = [i for i in items if path.endswith("/" + i["path"])]
    rendered = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    if not rendered:
        return None
    value: str = rendered[0]["data"][item["key"]]
    return base64.b64decode(value).decode() if kind == "Secret" else value


def assert_file_settings_mounted(
    c: Doc, volumes: list[Doc], extra_files: Iterable[str] = ()
) -> None:
    """Every path the gateway is told to read (creds, TLS, auth file) is a mounted file."""
    files = set(mounted_files(c, volumes)) | set(extra_files)
    for name in (
        "JSGW_NATS_CREDS",
        "JSGW_NATS_TLS_CA",
        "JSGW_NATS_TLS_CERT",
        "JSGW_NATS_TLS_KEY",
        "JSGW_AUTH_FILE",
        "JSGW_SUBSCRIPTIONS",
    ):
        path = env_values(c).get(name)
        if path is not None:
            assert path in files, (
                f"{name}={path} is not a file of a mounted Secret or ConfigMap ({sorted(files)})"
            )


def assert_tmp_writable(c: Doc, volumes: list[Doc]) -> None:
    """With a read-only root filesystem, /tmp must be an emptyDir."""
    by_name = {v["name"]: v for v in volumes}
    tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and "emptyDir" in by_name[tmp[0]["name"]], (
        f"{c['name']}: no emptyDir on /tmp"
    )


def probe_target(probe: Doc) -> tuple[str, str]:
    """(kind, what) of a probe: ("http", path) or ("exec", command line)."""
    if "httpGet" in probe:
        return "http", probe["httpGet"]["path"]
    if "exec" in probe:
        return "exec", " ".join(probe["exec"]["command"])
    raise AssertionError(f"unexpected probe {probe}")


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
