"""Who an anonymous client is, for the caps that count per client: its network address.

The address is the peer of the connection (the ASGI scope's ``client``). Only when that peer
is a trusted proxy (``JSGW_TRUSTED_PROXIES``) does the gateway read the forwarding header the
proxies set (``JSGW_PROXY_HEADER``: ``X-Forwarded-For``, or RFC 7239 ``Forwarded``), and then
as nginx's ``real_ip_recursive`` does: from the right, past every trusted proxy, the first
address that is not one is the client's. Everything left of it was written by the client (or
by proxies nobody vouches for) and is ignored.

IPv6 clients count per /64: one host usually holds a whole /64 and can take a new address
from it at will.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
ProxyHeader = Literal["x-forwarded-for", "forwarded"]

IPV6_PREFIX = 64
UNKNOWN = "unknown"  # a connection without a peer address (a Unix socket, a test transport)

# RFC 7239 section 6: obfuscated node names and ports ("_" then ALPHA / DIGIT / "." "_" "-").
_OBFUSCATED = re.compile(r"_[A-Za-z0-9._-]+")
_PORT = re.compile(r"[0-9]{1,5}|_[A-Za-z0-9._-]+")


def _port(text: str) -> bool:
    """A port as a forwarding header gives one: 0 to 65535, or obfuscated (RFC 7239 6.3)."""
    return bool(_PORT.fullmatch(text)) and (text[0] == "_" or int(text) <= 65535)


# RFC 7230 token characters, for the parameter names and unquoted values of ``Forwarded``.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def parse_networks(values: Iterable[str]) -> list[IPNetwork]:
    """IP addresses and CIDR ranges (``10.0.0.0/8``, ``::1``); a ValueError names a bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or CIDR range: {value!r}") from None
    return networks


def parse_address(text: str) -> IPAddress | None:
    """An IP address as proxies write one into ``X-Forwarded-For`` (and as a ``Forwarded``
    node without its quotes): ``192.0.2.1``, ``192.0.2.1:8080``, ``2001:db8::1``,
    ``[2001:db8::1]`` or ``[2001:db8::1]:8080``; None for anything else."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not (rest[0] == ":" and _port(rest[1:]))):
            return None
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    if text.count(":") == 1:  # IPv4 with a port
        text, port = text.split(":")
        if not _port(port):
            return None
        try:
            return ipaddress.IPv4Address(text)
        except ValueError:
            return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


# One hop of a forwarding chain: an address; an obfuscated identifier that a proxy gave the
# client instead (RFC 7239 6.3, the identifier itself); or None: "unknown", missing, malformed.
Hop = IPAddress | str | None


def x_forwarded_for(values: Sequence[str]) -> list[Hop]:
    """The hops of ``X-Forwarded-For`` header lines, left (first client) to right."""
    return [parse_address(part) for value in values for part in value.split(",")]


def forwarded(values: Sequence[str]) -> list[Hop]:
    """The ``for=`` hops of RFC 7239 ``Forwarded`` header lines, left to right. An element
    without ``for=``, or one that does not parse, is a hop of unknown address."""
    return [_forwarded_for(element) for value in values for element in _elements(value)]


def _elements(value: str) -> list[str]:
    """A ``Forwarded`` value split at the commas outside quoted strings."""
    elements: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            elements.append("".join(current))
            current = []
            continue
        current.append(char)
    elements.append("".join(current))
    return elements


def _forwarded_for(element: str) -> Hop:
    found: Hop = None
    seen_for = False
    for pair in _pairs(element):
        if pair is None:
            return None  # malformed: nothing in this element can be relied on
        name, node = pair
        if name != "for":
            continue
        if seen_for:
            return None  # RFC 7239 4: each parameter at most once per element
        seen_for = True
        found = _node(node)
    return found


def _pairs(element: str) -> list[tuple[str, str] | None]:
    """The ``name=value`` pairs of one element (values unquoted); None for a malformed one."""
    pairs: list[tuple[str, str] | None] = []
    rest = element.strip()
    while rest:
        name, sep, rest = rest.partition("=")
        name = name.strip()
        if not sep or not _TOKEN.fullmatch(name):
            return [None]
        rest = rest.lstrip()
        if rest.startswith('"'):
            value, rest = _quoted(rest)
            if value is None:
                return [None]
        else:
            value, semicolon, rest = rest.partition(";")
            value = value.strip()
            if not _TOKEN.fullmatch(value):
                return [None]
            rest = semicolon + rest
        pairs.append((name.lower(), value))
        rest = rest.strip()
        if rest:
            if not rest.startswith(";"):
                return [None]
            rest = rest[1:].strip()
    return pairs


def _quoted(text: str) -> tuple[str | None, str]:
    """The value of the quoted string ``text`` starts with, and what follows it."""
    value = []
    index = 1
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            value.append(text[index + 1])
            index += 2
            continue
        if char == '"':
            return "".join(value), text[index + 1 :]
        value.append(char)
        index += 1
    return None, ""  # no closing quote


def _node(node: str) -> Hop:
    """An RFC 7239 node: ``192.0.2.1``, ``"[2001:db8::1]:80"``, ``_hidden``, ``unknown``."""
    if node.lower() == UNKNOWN:
        return None
    if node.startswith("_"):
        name, _, port = node.partition(":")
        if _OBFUSCATED.fullmatch(name) and (not port or _port(port)):
            return name
        return None
    # (RFC 7239 wants IPv6 in brackets; a bare one without a port is still unambiguous.)
    return parse_address(node)


def client_of_chain(peer: IPAddress, hops: Sequence[Hop], trusted: Sequence[IPNetwork]) -> Hop:
    """The right-most hop that is not a trusted proxy, walking left from the peer; when every
    hop is trusted, the left-most. A hop of unknown address stops the walk: the client is the
    trusted proxy to its right, the nearest one that is known."""
    current: Hop = peer
    for hop in reversed(hops):
        if not isinstance(current, ipaddress.IPv4Address | ipaddress.IPv6Address):
            break
        if not _trusted(current, trusted):
            break
        if hop is None:
            break
        current = hop
    return current


def _trusted(address: IPAddress, trusted: Sequence[IPNetwork]) -> bool:
    address = _plain(address)
    return any(address.version == net.version and address in net for net in trusted)


def _plain(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (``::ffff:192.0.2.1``, as a dual-stack socket reports an
    IPv4 peer) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def key(hop: Hop) -> str:
    """The text a client is counted under: the IPv4 address, the IPv6 /64, the obfuscated
    identifier, or ``unknown``."""
    if hop is None:
        return UNKNOWN
    if isinstance(hop, str):
        return hop
    hop = _plain(hop)
    if isinstance(hop, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((hop, IPV6_PREFIX), strict=False))
    return str(hop)


class ClientAddresses:
    """Finds the client address of a request (see the module's docstring)."""

    def __init__(self, trusted: Sequence[IPNetwork] = (), header: ProxyHeader = "x-forwarded-for"):
        self.trusted = list(trusted)
        self.header = header.encode()
        self._parse = forwarded if header == "forwarded" else x_forwarded_for

    def of(self, scope: Mapping[str, Any]) -> str:
        """The key of the request's client (``scope`` is an ASGI HTTP scope)."""
        client = scope.get("client")
        peer = parse_address(str(client[0])) if client else None
        if peer is None:  # no address, or not an IP one (a test client's "testclient")
            return str(client[0]) if client else UNKNOWN
        if not self.trusted or not _trusted(peer, self.trusted):
            return key(peer)
        values = [
            value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name == self.header
        ]
        if not values:
            return key(peer)
        return key(client_of_chain(peer, self._parse(values), self.trusted))
