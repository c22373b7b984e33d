"""HTTPS serving, and client certificates as a way to authenticate."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import jsgw_serve
from tests.integration.test_embedded import free_port

pytestmark = pytest.mark.slow


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def issue(cwd: Path, ca: str, name: str, subject: str, *, server: bool = False) -> None:
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-subj",
        subject,
        "-out",
        f"{name}.csr",
        cwd=cwd,
    )
    ext = cwd / f"{name}.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else "extendedKeyUsage=clientAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        ext.name,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-subj",
            f"/CN={ca}",
            "-days",
            "2",
            "-out",
            f"{ca}.pem",
            cwd=d,
        )
    issue(d, "ca", "server", "/CN=localhost", server=True)
    issue(d, "ca", "orders", "/O=Example/CN=orders-service")
    issue(d, "ca", "stranger", "/CN=stranger")
    issue(d, "other-ca", "forged", "/O=Example/CN=orders-service")
    return d


def test_client_certificates_authenticate(
    pki: Path, nats_server: EmbeddedServer, tmp_path: Path
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        "  - name: orders\n"
        "    client_cert: 'CN=orders-service,O=Example'\n"
        "    rules: [{resource: 'stream:ORDERS_TLS', actions: [read, write, admin]}]\n"
        "  - name: admin\n"
        "    token: admin-token-0123456789\n"
        "    rules: [{resource: 'stream:*', actions: [read]}]\n"
    )
    port = free_port()
    settings = {
        "JSGW_PORT": str(port),
        "JSGW_NATS_URL": nats_server.url,
        "JSGW_AUTH_FILE": str(auth),
        "JSGW_TLS_CERT": str(pki / "server.pem"),
        "JSGW_TLS_KEY": str(pki / "server.key"),
        "JSGW_TLS_CLIENT_CA": str(pki / "ca.pem"),
    }
    base = f"https://127.0.0.1:{port}"
    ca = ssl.create_default_context(cafile=str(pki / "ca.pem"))

    def client(cert: str | None = None) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        if cert:
            context.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
        return httpx.Client(base_url=base, verify=context, timeout=10)

    with jsgw_serve(settings, tmp_path / "gw.log", ready=f"{base}/readyz", verify=ca):
        with client("orders") as orders:
            created = orders.put("/v1/streams/ORDERS_TLS", json={"subjects": ["orders_tls.>"]})
            assert created.status_code in (200, 201), created.text
            assert orders.post("/v1/publish/orders_tls.1", content=b"x").status_code == 200
            assert orders.get("/v1/streams/OTHER").status_code == 403
        with client() as anonymous:
            assert anonymous.get("/v1/streams/ORDERS_TLS").status_code == 401
            token = {"Authorization": "Bearer admin-token-0123456789"}
            assert anonymous.get("/v1/streams/ORDERS_TLS", headers=token).status_code == 200
        with client("stranger") as stranger:  # a valid certificate without grants
            body = stranger.get("/v1/streams/ORDERS_TLS").json()
            assert body["status"] == 401 and "certificate" in body["detail"]
        with client("forged") as forged, pytest.raises(httpx.HTTPError):
            forged.get("/v1/streams/ORDERS_TLS")  # same subject, another CA: no handshake
