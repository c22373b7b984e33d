"""The HTTPS defaults (app/tls.py) on an SSLContext, without a server: Mozilla's
"intermediate" profile (tests/security/test_tls_profile.py scans a real one with sslyze)."""

from __future__ import annotations

import ssl
from pathlib import Path

from app.config import Settings
from app.tls import INTERMEDIATE_CIPHERS, harden, hardened_context, set_groups, uvicorn_options


def test_harden_leaves_tls12_and_13_with_the_profiles_suites() -> None:
    context = harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    names = {cipher["name"] for cipher in context.get_ciphers()}
    tls12 = {name for name in names if not name.startswith("TLS_")}
    assert tls12 == set(INTERMEDIATE_CIPHERS.split(":"))
    assert all("GCM" in name or "CHACHA20" in name for name in names)
    assert context.options & ssl.OP_NO_COMPRESSION
    assert not context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_groups_are_set_through_openssl() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert set_groups(context, ("X25519", "prime256v1", "secp384r1"))
    assert not set_groups(context, ("no-such-group",))


def test_uvicorn_gets_the_hardened_context_factory(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    options = uvicorn_options(Settings(tls_cert=cert, tls_key=key))
    assert options["ssl_context_factory"] is hardened_context
    assert uvicorn_options(Settings()) == {}
