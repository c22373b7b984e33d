"""HTTPS as ``jsgw serve`` sets it up by default meets Mozilla's "intermediate" TLS profile, and
the SSE cookie is ``Secure`` over it.

sslyze (the scanner, with Mozilla's profile 5.7 built in) checks the versions, cipher suites,
key exchange groups and known vulnerabilities; Python's ssl module then tries handshakes the
profile excludes (TLS 1.1, CBC suites, X448 and P-521), so a regression names its cause.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from app.tls import INTERMEDIATE_GROUPS
from tests.helpers import jsgw_serve
from tests.integration.test_embedded import free_port

pytestmark = pytest.mark.slow

TOKEN = "tls-reader-token-0123456789"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a server certificate (RSA 2048, SHA-256, two days) for 127.0.0.1/localhost."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("tls-pki")
    common = ["-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2"]
    _openssl(
        "req", "-x509", *common, "-keyout", "ca.key", "-subj", "/CN=ca", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-subj", "/CN=localhost", "-out", "server.csr", cwd=d,
    )  # fmt: skip
    # The extensions a strict verifier (sslyze's, through cryptography) wants of a server.
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectKeyIdentifier=hash\n"
    )
    _openssl(
        "x509", "-req", "-sha256", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "server.ext", cwd=d,
    )  # fmt: skip
    return d


@pytest.fixture(scope="module")
def https_gateway(
    pki: Path, nats_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """``jsgw serve`` with JSGW_TLS_CERT (and nothing else about TLS): its port."""
    d = tmp_path_factory.mktemp("tls-gateway")
    auth = d / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - name: reader\n    token: {TOKEN}\n"
        "    rules: [{resource: 'kv:*', actions: [read]}]\n"
    )
    port = free_port()
    settings = {
        "JSGW_PORT": str(port),
        "JSGW_NATS_URL": nats_server.url,
        "JSGW_AUTH_FILE": str(auth),
        "JSGW_TLS_CERT": str(pki / "server.pem"),
        "JSGW_TLS_KEY": str(pki / "server.key"),
    }
    log = d / "gw.log"
    trusted = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    with jsgw_serve(settings, log, ready=f"https://127.0.0.1:{port}/readyz", verify=trusted):
        yield port
        assert "could not set the TLS key exchange groups" not in log.read_text()


@pytest.mark.filterwarnings("ignore:Parsed a serial number")  # a public root of sslyze's stores
def test_sslyze_finds_the_defaults_compliant_with_mozilla_intermediate(
    https_gateway: int, pki: Path
) -> None:
    sslyze = pytest.importorskip("sslyze")
    from sslyze.mozilla_tls_profile.tls_config_checker import (
        MozillaTlsConfiguration,
        ServerNotCompliantWithTlsConfiguration,
        TlsConfigurationEnum,
        check_server_against_tls_configuration,
    )
    from sslyze.plugins.certificate_info.implementation import CertificateInfoExtraArgument

    location = sslyze.ServerNetworkLocation("localhost", https_gateway, ip_address="127.0.0.1")
    request = sslyze.ServerScanRequest(
        server_location=location,
        # The test CA, as an operator's own CA would be: the certificate checks then judge the
        # certificate's key and signature, not whether a public CA issued it.
        scan_commands_extra_arguments=sslyze.ScanCommandsExtraArguments(
            certificate_info=CertificateInfoExtraArgument(custom_ca_file=pki / "ca.pem")
        ),
    )
    scanner = sslyze.Scanner()
    scanner.queue_scans([request])
    (result,) = list(scanner.get_results())
    assert result.scan_status == sslyze.ServerScanStatusEnum.COMPLETED, (
        result.connectivity_error_trace
    )
    scan = result.scan_result
    assert scan is not None
    curves = scan.elliptic_curves.result
    assert curves is not None
    supported = {curve.name for curve in curves.supported_curves}
    assert supported == {"X25519", "secp256r1", "secp384r1"}, supported  # SECG names
    assert scan.tls_compression.result is not None
    assert not scan.tls_compression.result.supports_compression
    intermediate = MozillaTlsConfiguration.get(TlsConfigurationEnum.MOZILLA_INTERMEDIATE)
    try:
        check_server_against_tls_configuration(result, intermediate)
    except ServerNotCompliantWithTlsConfiguration as exc:
        pytest.fail(f"not Mozilla intermediate: {exc.issues}")


def _handshake(port: int, pki: Path, configure: object) -> str:
    """The negotiated cipher of a handshake with a client set up by ``configure``; raises
    ssl.SSLError when the server refuses it."""
    import socket

    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    configure(context)  # type: ignore[operator]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        cipher = tls.cipher()
        assert cipher is not None
        return f"{tls.version()} {cipher[0]}"


def _tls12(ciphers: str | None = None, group: str | None = None) -> object:
    def configure(context: ssl.SSLContext) -> None:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        if ciphers:
            context.set_ciphers(ciphers)
        if group:
            context.set_ecdh_curve(group)

    return configure


def _tls13(group: str) -> object:
    def configure(context: ssl.SSLContext) -> None:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.set_ecdh_curve(group)

    return configure


@pytest.mark.parametrize("group", INTERMEDIATE_GROUPS)
def test_the_profiles_groups_are_offered(https_gateway: int, pki: Path, group: str) -> None:
    assert _handshake(https_gateway, pki, _tls13(group)).startswith("TLSv1.3 ")
    assert _handshake(https_gateway, pki, _tls12(group=group)).startswith("TLSv1.2 ECDHE-RSA-")


@pytest.mark.parametrize("group", ["X448", "secp521r1"])
def test_other_groups_are_refused(https_gateway: int, pki: Path, group: str) -> None:
    for configure in (_tls13(group), _tls12(group=group)):
        with pytest.raises(ssl.SSLError):
            _handshake(https_gateway, pki, configure)


@pytest.mark.parametrize(
    "ciphers",
    [
        "ECDHE-RSA-AES128-SHA",  # CBC
        "ECDHE-RSA-AES256-SHA384",  # CBC
        "AES128-GCM-SHA256",  # static RSA: no forward secrecy
        "DHE-RSA-AES128-GCM-SHA256",
    ],
)
def test_tls12_suites_outside_the_profile_are_refused(
    https_gateway: int, pki: Path, ciphers: str
) -> None:
    with pytest.raises(ssl.SSLError):
        _handshake(https_gateway, pki, _tls12(ciphers + ":@SECLEVEL=0"))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls11_is_refused(https_gateway: int, pki: Path) -> None:
    def configure(context: ssl.SSLContext) -> None:
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1

    with pytest.raises(ssl.SSLError):
        _handshake(https_gateway, pki, configure)


def test_sse_cookie_is_secure_over_https(https_gateway: int, pki: Path) -> None:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    minted = httpx.post(
        f"https://127.0.0.1:{https_gateway}/v1/auth/sse-token",
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=context,
        timeout=10,
    )
    assert minted.status_code == 200, minted.text
    attributes = [part.strip().lower() for part in minted.headers["set-cookie"].split(";")]
    assert attributes[0].startswith("jsgw_sse=")
    assert "secure" in attributes and "httponly" in attributes, attributes
