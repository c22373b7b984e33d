"""The layering rules of docs/architecture.md, checked on the import statements of the code.

Each rule names the modules it binds and what they may not import; an import inside a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DOMAINS

ROOT = Path(__file__).resolve().parents[2]
HTTP_LIBRARIES = ("fastapi", "starlette", "sse_starlette", "uvicorn")


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, as written (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``, since ``c`` may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _domain_packages() -> list[Path]:
    """The domain packages: app/<domain>/ with a service module."""
    return sorted(p.parent for p in (ROOT / "app").glob("*/service.py"))


def _violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{_module(path)} imports {name}"
        for path in paths
        for name in sorted(set(_imports(path)))
        if _within(name, forbidden)
    ]


def test_the_domain_packages_are_found() -> None:
    names = [p.name for p in _domain_packages()]
    assert {"kv", "streams", "publish", "direct", "consumers"} <= set(names), names


def test_services_and_the_protocol_kit_never_import_the_http_layer() -> None:
    # A domain's http.py is its HTTP face (responses shared by the router and the lean
    # path); everything else in the package, and the NATS kit, stays usable without a server.
    paths = [
        path
        for package in [*_domain_packages(), ROOT / "app" / "nats"]
        for path in package.glob("*.py")
        if path.name != "http.py"
    ]
    assert paths
    assert _violations(paths, HTTP_LIBRARIES) == []


def test_services_and_the_protocol_kit_never_import_routers() -> None:
    paths = [p for p in (ROOT / "app").rglob("*.py") if p.name != "main.py"]
    assert _violations(paths, ("routers",)) == []
    assert "routers" in {name.split(".")[0] for name in _imports(ROOT / "app" / "main.py")}


def test_routers_reach_nats_through_the_services_only() -> None:
    paths = sorted((ROOT / "routers").glob("*.py"))
    assert _violations(paths, ("nats",)) == []


# Which domains each domain builds on: a KV bucket is a stream, its writes are publishes and
# its reads are Direct Gets; a consumer's config shares the stream's duration fields. The
# graph has no cycles, so the base domains stay usable on their own.
BUILDS_ON: dict[str, set[str]] = {
    "kv": {"streams", "publish", "direct"},
    "consumers": {"streams"},
    "counters": {"streams", "publish", "direct"},
    # Push delivery pulls from consumers, keeps its subscriptions in a KV bucket and
    # publishes dead letters.
    "push": {"consumers", "kv", "publish"},
    # Object buckets create their streams as the streams domain does.
    "obj": {"streams"},
    # Core NATS checks its messages' size and user headers as a publish does.
    "corenats": {"publish"},
    "streams": set(),
    "publish": set(),
    "direct": set(),
}


@pytest.mark.parametrize("package", _domain_packages(), ids=lambda p: p.name)
def test_a_domain_imports_only_the_domains_it_builds_on(package: Path) -> None:
    assert package.name in BUILDS_ON, f"say what app/{package.name} builds on in BUILDS_ON"
    others = tuple(
        f"app.{p.name}"
        for p in _domain_packages()
        if p != package and p.name not in BUILDS_ON[package.name]
    )
    assert _violations(sorted(package.glob("*.py")), others) == []


def test_pipeline_does_not_import_the_gateway() -> None:
    # The Spark data source talks to the gateway over HTTP only.
    paths = sorted((ROOT / "pipeline").rglob("*.py"))
    assert _violations(paths, ("app", "routers", "fastapi", "starlette")) == []


@pytest.mark.parametrize("package", _domain_packages(), ids=lambda p: p.name)
def test_every_domain_has_a_test_marker(package: Path) -> None:
    assert package.name in DOMAINS, f"add app/{package.name} to DOMAINS in tests/conftest.py"


def test_only_the_pool_makes_the_patched_client() -> None:
    # LeanClient (nats-py's Client with the gateway's parser and reply routing) is created by
    # the pool alone; everything else gets connections from the pool, so a connection never
    # misses the pool's reconnect, probe and reply handling.
    allowed = {"app.nats.pool", "app.nats.replies"}
    paths = [
        p
        for p in [*(ROOT / "app").rglob("*.py"), *(ROOT / "routers").glob("*.py")]
        if _module(p) not in allowed
    ]
    assert _violations(paths, ("app.nats.replies.LeanClient", "app.nats.wire")) == []
