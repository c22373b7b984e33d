"""HTTPS serving, with client certificates as an optional way to authenticate.

The TLS settings are Mozilla's "intermediate" profile (Server Side TLS 5.7): TLS 1.2 and 1.3
only; for TLS 1.2 only ECDHE key exchange with AES-GCM or ChaCha20-Poly1305 (no CBC, no
static RSA, no DHE); key exchange groups X25519, P-256 and P-384 (OpenSSL's defaults add X448
and P-521). TLS 1.3's cipher suites are OpenSSL's defaults, which are the profile's.

uvicorn terminates TLS but does not tell the application who the client certificate names.
This protocol class (uvicorn's own httptools protocol, plus one step) puts it in the scope as
the ASGI TLS extension does: ``scope["extensions"]["tls"]["client_cert_name"]``, an RFC 4514
subject such as ``CN=orders-service,O=Example``.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from app.config import Settings
from app.serving import GatheringProtocol

log = logging.getLogger("jsgw.tls")

# Mozilla intermediate, TLS 1.2 (DHE left out: it needs DH parameters of its own, and every
# client that speaks TLS 1.2 has ECDHE).
INTERMEDIATE_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)
INTERMEDIATE_GROUPS = ("X25519", "prime256v1", "secp384r1")
_SSL_CTRL_SET_GROUPS_LIST = 92  # SSL_CTX_set1_groups_list is this SSL_CTX_ctrl (a macro)


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

    def _extend_scope(self, scope: dict[str, Any]) -> None:
        if self._client_cert_name is not None:
            extensions = scope.setdefault("extensions", {})
            extensions["tls"] = {"client_cert_name": self._client_cert_name}


def client_cert_name(scope: Mapping[str, Any]) -> str | None:
    tls = (scope.get("extensions") or {}).get("tls") or {}
    name = tls.get("client_cert_name")
    return name if isinstance(name, str) else None


def harden(context: ssl.SSLContext) -> ssl.SSLContext:
    """``context`` set to Mozilla's intermediate profile (see the module's docstring)."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(INTERMEDIATE_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    # The profile lets the client choose: every suite offered is strong, and a phone without
    # AES instructions prefers ChaCha20.
    context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if not set_groups(context, INTERMEDIATE_GROUPS):
        # Python's own API sets one group: P-256 is within the profile, and every client has it.
        context.set_ecdh_curve("prime256v1")
        log.warning(
            "could not set the TLS key exchange groups to %s; using prime256v1 only",
            ":".join(INTERMEDIATE_GROUPS),
        )
    return context


def set_groups(context: ssl.SSLContext, groups: tuple[str, ...]) -> bool:
    """OpenSSL's ``SSL_CTX_set1_groups_list`` on ``context``: Python's ssl module (before
    3.15) sets only one group (``set_ecdh_curve``). False when it cannot be done here.

    The ``SSL_CTX`` pointer is the first field after the object header of Python's
    ``PySSLContext``; it is trusted only when OpenSSL reads the same options from it as
    Python reports for the context.
    """
    try:
        import _ssl

        library = ctypes.CDLL(_ssl.__file__)  # OpenSSL's symbols, through _ssl's dependencies
        ctrl = library.SSL_CTX_ctrl
        get_options = library.SSL_CTX_get_options
    except (OSError, AttributeError, ImportError):
        return False
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p]
    ctrl.restype = ctypes.c_long
    get_options.argtypes = [ctypes.c_void_p]
    get_options.restype = ctypes.c_uint64
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer or get_options(pointer) != int(context.options):
        return False
    result: int = ctrl(pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, ":".join(groups).encode())
    return result == 1


def hardened_context(config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's ``ssl_context_factory``: its context (certificate, client CA), hardened."""
    return harden(default())


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.run keyword arguments for HTTPS, or {} to serve plain HTTP."""
    if settings.tls_cert is None:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": str(settings.tls_cert),
        "ssl_keyfile": str(settings.tls_key),
        "ssl_context_factory": hardened_context,
    }
    if settings.tls_client_ca is not None:
        # Optional: clients without a certificate still authenticate with bearer tokens.
        options["ssl_ca_certs"] = str(settings.tls_client_ca)
        options["ssl_cert_reqs"] = ssl.CERT_OPTIONAL
        options["http"] = ClientCertProtocol
    return options
