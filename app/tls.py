"""HTTPS serving, with client certificates as an optional way to authenticate.

uvicorn terminates TLS but does not tell the application who the client certificate names.
This protocol class (uvicorn's own httptools protocol, plus one step) puts it in the scope as
the ASGI TLS extension does: ``scope["extensions"]["tls"]["client_cert_name"]``, an RFC 4514
subject such as ``CN=orders-service,O=Example``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

from app.config import Settings
from app.serving import GatheringProtocol


def subject_name(cert: dict[str, Any] | None) -> str | None:
    """The subject of a certificate from ``SSLSocket.getpeercert()``, RFC 4514 style."""
    if not cert or "subject" not in cert:
        return None
    parts = []
    for rdn in reversed(cert["subject"]):  # RFC 4514 lists the most specific part first
        for key, value in rdn:
            short = _SHORT_NAMES.get(key, key)
            escaped = value.replace("\\", "\\\\").replace(",", "\\,").replace("+", "\\+")
            parts.append(f"{short}={escaped}")
    return ",".join(parts)


_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "domainComponent": "DC",
    "userId": "UID",
}


class ClientCertProtocol(GatheringProtocol):
    """The gateway's HTTP protocol (app.serving), exposing the verified client certificate's
    subject."""

    _client_cert_name: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            # getpeercert() is only filled in for a certificate the CA verified.
            self._client_cert_name = subject_name(ssl_object.getpeercert())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._client_cert_name is not None:
            extensions = self.scope.setdefault("extensions", {})
            extensions["tls"] = {"client_cert_name": self._client_cert_name}


def client_cert_name(scope: Mapping[str, Any]) -> str | None:
    tls = (scope.get("extensions") or {}).get("tls") or {}
    name = tls.get("client_cert_name")
    return name if isinstance(name, str) else None


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.run keyword arguments for HTTPS, or {} to serve plain HTTP."""
    if settings.tls_cert is None:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": str(settings.tls_cert),
        "ssl_keyfile": str(settings.tls_key),
    }
    if settings.tls_client_ca is not None:
        # Optional: clients without a certificate still authenticate with bearer tokens.
        options["ssl_ca_certs"] = str(settings.tls_client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_OPTIONAL
        options["http"] = ClientCertProtocol
    return options
