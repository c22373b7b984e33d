"""app.compat: start-up refuses, with a message saying what moved and where it is used, to
run on a release whose private names moved (simulated here by moving them)."""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from packaging.requirements import Requirement
from sse_starlette import sse as sse_module
from uvicorn.protocols.http import httptools_impl

from app import cli, compat
from app.compat import NatsClient, NatsParser
from app.config import Settings
from app.main import create_app

_ADVICE = "Install the tested versions (pip install -c constraints.txt)"


@pytest.fixture(autouse=True)
def uncached() -> Iterator[None]:
    compat.check.cache_clear()
    yield
    compat.check.cache_clear()  # (what the tests moved is back: the next check passes)


def _refusal() -> str:
    with pytest.raises(RuntimeError) as refused:
        compat.check()
    return str(refused.value)


def test_the_tested_releases_pass() -> None:
    assert compat.problems() == []
    compat.check()


@pytest.mark.parametrize("pin", compat.PINS, ids=lambda pin: pin.distribution)
def test_pyproject_caps_each_library_at_the_series_compat_checks(pin: compat.Pin) -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (requirement,) = [
        r
        for r in map(Requirement, project["project"]["dependencies"])
        if r.name == pin.distribution
    ]
    major, minor = map(int, pin.tested.split("."))
    allowed = requirement.specifier.contains
    assert allowed(f"{pin.tested}.0") and allowed(f"{pin.tested}.99")
    assert not allowed(f"{major}.{minor + 1}.0") and not allowed(f"{major}.{minor - 1}.99")


def test_a_missing_private_method(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(NatsClient, "_process_op_err")
    message = _refusal()
    installed = compat.NATS.installed
    assert (
        f"  - nats-py {installed} (tested: 2.16.x): Client._process_op_err does not exist; "
        "used by app/nats/pool.py\n"
    ) in message
    assert message.startswith("jsgw cannot run with the installed libraries") and _ADVICE in message
    assert "uvicorn" not in message and "sse-starlette" not in message


def test_a_changed_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NatsParser, "reset", lambda self, hard: None)
    assert "Parser.reset takes (self, hard), not (self); used by app/nats/wire.py" in _refusal()


def test_a_moved_uvicorn_method(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_message_begin")
    message = _refusal()
    assert f"uvicorn {compat.UVICORN.installed} (tested: 0.54.x)" in message
    assert (
        "HttpToolsProtocol.on_message_begin does not exist; used by app/serving.py, app/tls.py"
        in message
    )


def test_a_name_the_subclass_would_shadow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httptools_impl.HttpToolsProtocol, "_stall_check", None, raising=False)
    assert (
        "HttpToolsProtocol._stall_check now exists, and would be shadowed; used by "
        "app/serving.py" in _refusal()
    )


@pytest.mark.parametrize("text", [rb"[\x00-\x1f]|\r\n", rb"[\x00-\x1fA-Z]"])
def test_a_header_pattern_that_is_no_longer_one_character_class(
    monkeypatch: pytest.MonkeyPatch, text: bytes
) -> None:
    """The direct path searches all header values in one text, names lower-cased: right only
    for a pattern that matches one byte at a time, and no letter."""
    pattern = re.compile(text)
    monkeypatch.setattr(httptools_impl, "HEADER_VALUE_RE", pattern)
    assert (
        f"httptools_impl.HEADER_VALUE_RE is {pattern.pattern!r}, not one character class "
        "without letters (searched over all headers at once, names lower-cased); used by "
        "app/serving.py, app/fastpath.py" in _refusal()
    )


def test_a_moved_sse_starlette_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sse_module, "AppStatus")
    message = _refusal()
    assert f"sse-starlette {compat.SSE.installed} (tested: 3.7.x)" in message
    assert "sse_starlette.sse.AppStatus does not exist; used by app/sse.py" in message


def test_a_check_that_breaks_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """(A module that moved breaks the import in its library's check.)"""

    def moved(_: Any) -> None:
        import sse_starlette.moved  # noqa: F401

    monkeypatch.setattr(compat, "_CHECKS", (*compat._CHECKS[:2], (compat.SSE, moved)))
    message = _refusal()
    assert (
        f"sse-starlette {compat.SSE.installed} (tested: 3.7.x): the check broke: "
        "ModuleNotFoundError(" in message
    )


def test_every_problem_is_listed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(NatsClient, "_process_op_err")
    monkeypatch.delattr(sse_module, "AppStatus")
    message = _refusal()
    assert "Client._process_op_err" in message and "AppStatus" in message


def test_another_series_with_every_name_in_place_is_only_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = compat.version
    monkeypatch.setattr(compat, "version", lambda d: "2.17.0" if d == "nats-py" else real(d))
    with caplog.at_level(logging.WARNING, "jsgw.compat"):
        compat.check()
    assert "nats-py 2.17.0 is installed, but jsgw was tested with 2.16.x" in caplog.text


def test_checked_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(compat, "problems", lambda: calls.append(1) or [])
    for _ in range(3):
        compat.check()
        create_app(Settings(nats_url=["nats://127.0.0.1:1"]))
    assert calls == [1]


async def test_an_app_does_not_start_on_moved_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before the lifespan starts anything (no nats-server, no connection)."""
    monkeypatch.setattr(compat, "problems", lambda: ["nats-py 9.0.0 (tested: 2.16.x): X moved"])
    app: Any = create_app(Settings(nats_url=["nats://127.0.0.1:1"]))
    with pytest.raises(RuntimeError, match="X moved"):
        async with app.router.lifespan_context(app):
            pass


def test_serve_refuses_before_taking_a_port(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compat, "problems", lambda: ["uvicorn 9.0.0 (tested: 0.54.x): X moved"])
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn was started"))
    monkeypatch.setenv("JSGW_NATS_URL", "nats://127.0.0.1:1")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve"])
    assert str(exit_.value).startswith("jsgw cannot run") and "X moved" in str(exit_.value)


def test_a_moved_prometheus_file_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import mmap_dict

    monkeypatch.delattr(mmap_dict, "mmap_key")
    assert any("mmap_key" in line and "app/metrics.py" in line for line in compat.problems())


def test_prometheus_files_that_read_back_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import mmap_dict

    monkeypatch.setattr(
        mmap_dict.MmapedDict, "read_all_values_from_file", staticmethod(lambda path: iter(()))
    )
    assert any("MmapedDict files" in line for line in compat.problems())
