"""Which URLs the gateway may POST messages to: ``JSGW_PUSH_ALLOWED_URLS``.

A subscription's endpoint is a URL that anyone allowed to manage a subscription chooses, and
the gateway calls it from inside the pod or the cluster network: without a limit, an API user
could make it call internal services (server-side request forgery). The allowlist is a list
of URL prefixes, matched on the parsed URL, never on the text:

- the same scheme (``http`` or ``https``);
- the same host, compared case-insensitively and exactly: ``http://127.0.0.1`` does not allow
  ``http://127.0.0.1.evil.example``, and an address written another way (``2130706433``,
  ``0x7f.1``) is another host, so refused;
- the same port when the prefix names one (``http://localhost:8080``), any port otherwise;
- the prefix's path as a whole number of segments: ``/hooks`` allows ``/hooks`` and
  ``/hooks/orders``, not ``/hooksmith``.

An endpoint with user information (``http://a@b``), with whitespace, control characters or a
backslash anywhere, with dot segments or encoded dots and slashes in its path, or with a
fragment, is refused outright: each is a way to make one parser read another host or path
than the next. Endpoints are parsed by httpx's URL parser, as the delivery client
(app/push/transport.py) parses them, so what is checked is what is called (the parser also
removes ``.``/``..`` segments: checked after that).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from app import errors
from app.errors import ErrorCode

if TYPE_CHECKING:
    import httpx

DEFAULT_ALLOWED = ("http://127.0.0.1", "http://localhost")
MAX_ENDPOINT_LENGTH = 2048
_SCHEMES = {"http": 80, "https": 443}
# A host name or an IPv4 address (letters, digits, '-' and '.'), or an IPv6 literal.
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|[0-9a-f:.]*:[0-9a-f:.]*")
# Anything a URL parser might read differently from the next one.
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
_ENCODED_SEPARATOR = re.compile(r"%(2[eEfF]|5[cC])")


class EndpointError(ValueError):
    """Why a URL is not an endpoint (or not a prefix) the gateway accepts."""


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed URL as far as the allowlist looks at it."""

    scheme: str
    host: str
    port: int
    explicit_port: bool
    path: str

    def under(self, prefix: Target) -> bool:
        if (self.scheme, self.host) != (prefix.scheme, prefix.host):
            return False
        if prefix.explicit_port and self.port != prefix.port:
            return False
        base = prefix.path.rstrip("/")
        return not base or self.path == base or self.path.startswith(base + "/")


def parse(url: str, *, what: str = "endpoint") -> Target:
    """The scheme, host, port and path of an absolute http(s) URL; EndpointError otherwise."""
    if len(url) > MAX_ENDPOINT_LENGTH:
        raise EndpointError(f"the {what} is longer than {MAX_ENDPOINT_LENGTH} characters")
    if _UNSAFE.search(url):
        raise EndpointError(f"the {what} holds whitespace, a control character or a backslash")
    try:
        parsed = http_url(url)
        # (The host is decoded here: IDNA refuses some, e.g. "xn--", with a ValueError.)
        parsed_host = parsed.host
    except ValueError as exc:
        raise EndpointError(f"the {what} is not a URL: {exc}") from None
    scheme = parsed.scheme.lower()
    if scheme not in _SCHEMES or not parsed.is_absolute_url or not parsed_host:
        raise EndpointError(f"the {what} must be an absolute http:// or https:// URL")
    if parsed.userinfo or "@" in _authority(url):
        raise EndpointError(f"the {what} must not hold user information (user@host)")
    if parsed.fragment or "#" in url:
        raise EndpointError(f"the {what} must not have a fragment (#...)")
    host = parsed_host.lower()
    if _HOST.fullmatch(host) is None:
        raise EndpointError(f"the {what}'s host {parsed_host!r} is not a host name or address")
    port = parsed.port
    if port is not None and not 1 <= port <= 65535:
        raise EndpointError(f"the {what}'s port {port} is not from 1 to 65535")
    # The path as written (the parser removes dot segments: refused anyway, as a server
    # behind the endpoint may read it otherwise) and as the delivery client sends it.
    written = re.split(r"[?#]", url.partition("//")[2], maxsplit=1)[0]
    written = written[len(_authority(url)) :]
    path = parsed.raw_path.decode("ascii").split("?", 1)[0] or "/"
    for text in (written, path):
        if _ENCODED_SEPARATOR.search(text):
            raise EndpointError(f"the {what}'s path encodes a '.', '/' or '\\' (%2e, %2f, %5c)")
        if any(segment in (".", "..") for segment in unquote(text).split("/")):
            raise EndpointError(f"the {what}'s path has '.' or '..' segments")
    return Target(scheme, host, port or _SCHEMES[scheme], port is not None, path)


def http_url(text: str) -> httpx.URL:
    """``text`` parsed by httpx's URL parser (ValueError if it is not a URL).

    httpx is imported here, on first use: the gateway uses nothing else of it, and importing
    the package costs a worker about 13 MB (more where its command line's libraries are
    installed), which a gateway that pushes to no endpoint never needs. An explicit
    ``JSGW_PUSH_ALLOWED_URLS`` is checked by the settings, at start-up."""
    import httpx

    try:
        return httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(str(exc)) from None


class Allowlist:
    """The prefixes of ``JSGW_PUSH_ALLOWED_URLS`` (an explicit setting is checked as URLs
    at start-up by app.config; here they are parsed on the first check)."""

    def __init__(self, prefixes: list[str] | tuple[str, ...]) -> None:
        self.prefixes = tuple(prefixes)

    @functools.cached_property
    def _targets(self) -> tuple[Target, ...]:
        return tuple(parse_prefix(prefix) for prefix in self.prefixes)

    def allows(self, endpoint: str) -> bool:
        try:
            target = parse(endpoint)
        except EndpointError:
            return False
        return any(target.under(prefix) for prefix in self._targets)

    def check(self, endpoint: str) -> str:
        """``endpoint``, if the gateway may call it; 400 ``subscription.endpoint_not_allowed``
        saying why not."""
        try:
            target = parse(endpoint)
        except EndpointError as exc:
            raise _refused(str(exc)) from None
        if not any(target.under(prefix) for prefix in self._targets):
            allowed = ", ".join(self.prefixes) or "(none)"
            raise _refused(
                f"the endpoint is not under any prefix of JSGW_PUSH_ALLOWED_URLS ({allowed})"
            )
        return endpoint


def _authority(url: str) -> str:
    """The text between ``//`` and the path, query or fragment (what a parser takes the host
    and user information from)."""
    rest = url.partition("//")[2]
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def parse_prefix(prefix: str) -> Target:
    """A prefix of the allowlist: an absolute http(s) URL without query or user information."""
    target = parse(prefix, what="prefix")
    if "?" in prefix:
        raise EndpointError(f"the prefix {prefix!r} has a query")
    return target


def _refused(detail: str) -> errors.InvalidInput:
    return errors.InvalidInput(ErrorCode.SUBSCRIPTION_ENDPOINT_NOT_ALLOWED, detail)
