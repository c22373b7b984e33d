"""constraints.txt: the versions the suite passed with, which every install is held to
(`make test` and so CI, deploy/Dockerfile). It must agree with pyproject.toml: every
dependency (extras included) pinned, each to a version its range allows, and the pins a
consistent set (what each pinned package requires is pinned too, within its range)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, distribution

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helm.manifests import REPO

CONSTRAINTS = REPO / "constraints.txt"
REGENERATE = "edit the pin (and the range), run `make test`, then `make lock`"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert match, f"constraints.txt: {line!r} is not a name==version pin"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = Version(match.group(2))
    return pins


def _dependencies() -> list[Requirement]:
    """pyproject.toml's requirements that apply here, with every extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    texts = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        texts += extra
    return [r for r in map(Requirement, texts) if r.marker is None or r.marker.evaluate()]


@pytest.fixture(scope="module")
def pins() -> dict[str, Version]:
    return _pins()


def test_jsgw_itself_is_not_pinned(pins: dict[str, Version]) -> None:
    assert "jsgw" not in pins


def test_every_dependency_is_pinned_within_its_range(pins: dict[str, Version]) -> None:
    for requirement in _dependencies():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in constraints.txt: {REGENERATE}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's "
            f"{requirement}: {REGENERATE}"
        )


def test_the_pins_are_a_consistent_set(pins: dict[str, Version]) -> None:
    """What each pinned package requires (read from the installed package) is pinned and in
    range: the set installs as it is, with nothing left for pip to choose."""
    wanted: list[tuple[str, set[str]]] = [
        (canonicalize_name(r.name), r.extras) for r in _dependencies()
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while wanted:
        name, extras = wanted.pop()
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            pytest.fail(f"{name} is pinned but not installed: reinstall with -c constraints.txt")
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                continue
            needed = canonicalize_name(requirement.name)
            assert needed in pins, f"{name} requires {requirement}, not in constraints.txt"
            assert requirement.specifier.contains(pins[needed], prereleases=True), (
                f"{name} requires {requirement}; constraints.txt pins {pins[needed]}"
            )
            wanted.append((needed, requirement.extras))


def test_the_suite_runs_on_the_pinned_versions(pins: dict[str, Version]) -> None:
    for name, pinned in pins.items():
        try:
            installed = Version(distribution(name).version)
        except PackageNotFoundError:
            continue  # (a tool of a platform or an extra not installed here)
        assert installed == pinned, (
            f"{name} {installed} is installed, constraints.txt pins {pinned}: reinstall with "
            f"`pip install -e '.[test]' -c constraints.txt`, or {REGENERATE}"
        )


def test_make_installs_with_the_constraints() -> None:
    """`make test` (CI's command, .ci/run) installs with them, and again when they change."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS := constraints\.txt$", makefile, re.MULTILINE)
    rule = re.search(r"^\$\(STAMP\): (.*)\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert rule, "no $(STAMP) rule in the Makefile"
    assert "$(CONSTRAINTS)" in rule.group(1).split()
    installs = [line for line in rule.group(2).splitlines() if re.search(r"pip install .*\.", line)]
    assert installs and all("-c $(CONSTRAINTS)" in line for line in installs), installs
