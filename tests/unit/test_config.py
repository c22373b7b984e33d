from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.embedded and s.pool_size == 2 and s.port == 8080 and s.workers == 1
    assert s.listens_on_loopback


def test_env_prefix_and_comma_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JSGW_NATS_URL", "nats://a:4222, tls://b:4222")
    monkeypatch.setenv("JSGW_CORS_ORIGINS", "https://x.example,https://y.example")
    monkeypatch.setenv("JSGW_NATS_TOKEN", "s3cret")
    s = Settings()
    assert s.nats_url == ["nats://a:4222", "tls://b:4222"]
    assert s.cors_origins == ["https://x.example", "https://y.example"]
    assert "s3cret" not in repr(s)


@pytest.mark.parametrize(
    "values",
    [
        {"pool_size": 0},
        {"port": 70000},
        {"request_timeout": 0},
        {"nats_url": "http://x"},
        {"js_domain": "a.b"},
        {"js_domain": "a b"},
        {"log_level": "loud"},
        {"nats_creds": "/does/not/exist"},
        {"nats_url": "nats://x", "nats_user": "u"},
        {"nats_url": "nats://x", "nats_user": "u", "nats_password": "p", "nats_token": "t"},
        {"nats_tls_cert": __file__},
        {"workers": 2},
        {"nats_token": "t"},
    ],
)
def test_bad_values_fail(values: dict) -> None:
    with pytest.raises(ValidationError):
        Settings(**values)


def test_tls_pair(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    s = Settings(nats_url="tls://x:4222", nats_tls_cert=cert, nats_tls_key=key)
    assert s.nats_tls_cert == cert


def test_lean_paths_are_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().lean_paths
    monkeypatch.setenv("JSGW_LEAN_PATHS", "false")
    assert not Settings().lean_paths
