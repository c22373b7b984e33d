"""The chart loaded once with Helm's own library (helm-python-sdk: Helm's Go SDK via ctypes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.helm.manifests import CHART, Doc, load_yaml_docs

RELEASE = "demo"
NAMESPACE = "jsgw-test"

Render = Callable[..., list[Doc]]


def rendered_docs(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[Doc]:
    """`helm template`: every manifest the chart renders (NOTES.txt left out)."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    docs: list[Doc] = []
    for path, text in sorted(out.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(load_yaml_docs(text))
    return docs


@pytest.fixture(scope="session")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Helm's cache/config/data dirs in a temporary place, never the user's."""
    home = tmp_path_factory.mktemp("helm-home")
    saved = {
        k: os.environ.get(k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
    }
    for key in saved:
        os.environ[key] = str(home / key.lower())
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def chart(helm_home: Path) -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm.Chart) -> Render:
    return lambda values=None: rendered_docs(chart, values)
