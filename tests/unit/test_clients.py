"""The client address of a request (app.clients): the peer, or from a trusted proxy's
forwarding header the right-most address that is not a trusted proxy."""

from __future__ import annotations

import ipaddress
import re

import pytest
from pydantic import ValidationError

from app.auth.policy import ANONYMOUS, Principal
from app.clients import (
    ClientAddresses,
    forwarded,
    parse_address,
    parse_networks,
    x_forwarded_for,
)
from app.config import Settings
from app.errors import TooManyRequests
from app.sse import SseSlots

ip = ipaddress.ip_address


def scope(peer: str | None, *headers: tuple[str, str]) -> dict:
    return {
        "type": "http",
        "client": (peer, 40000) if peer is not None else None,
        "headers": [(name.lower().encode(), value.encode("latin-1")) for name, value in headers],
    }


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("192.0.2.1", "192.0.2.1"),
        (" 192.0.2.1 ", "192.0.2.1"),
        ("192.0.2.1:8080", "192.0.2.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("::ffff:192.0.2.1", "::ffff:192.0.2.1"),
        ("", None),
        ("unknown", None),
        ("192.0.2", None),
        ("192.0.2.1:", None),
        ("192.0.2.1:port", None),
        ("192.0.2.1:123456", None),
        ("[2001:db8::1", None),
        ("[2001:db8::1]443", None),
        ("[192.0.2.1]", None),
        ("2001:db8::1:443:", None),
        ("example.com", None),
        ("300.1.1.1", None),
    ],
)
def test_addresses_as_proxies_write_them(text: str, address: str | None) -> None:
    assert parse_address(text) == (ip(address) if address else None)


def test_x_forwarded_for_lists_every_hop_of_every_line() -> None:
    assert x_forwarded_for(["203.0.113.7, 10.0.0.1", "10.0.0.2:5000,,garbage"]) == [
        ip("203.0.113.7"),
        ip("10.0.0.1"),
        ip("10.0.0.2"),
        None,
        None,
    ]


@pytest.mark.parametrize(
    ("value", "hops"),
    [
        ("for=192.0.2.60;proto=http;by=203.0.113.43", [ip("192.0.2.60")]),
        ('For="[2001:db8:cafe::17]:4711"', [ip("2001:db8:cafe::17")]),
        ('for="192.0.2.43:47011"', [ip("192.0.2.43")]),
        ("for=192.0.2.43, for=198.51.100.17", [ip("192.0.2.43"), ip("198.51.100.17")]),
        ("for = 192.0.2.43 ; by=_proxy", [ip("192.0.2.43")]),
        # Obfuscated identifiers (RFC 7239 6.3) are the client's identity as the proxy gives it.
        ("for=_hidden, for=_SEVKISEK", ["_hidden", "_SEVKISEK"]),
        ('for="_hidden:_port"', ["_hidden"]),
        ('for="_hidden:8080"', ["_hidden"]),
        # unknown, a missing for=, and anything malformed: a hop of unknown address.
        ("for=unknown", [None]),
        ('for="unknown:80"', [None]),
        ("proto=https;by=10.0.0.1", [None]),
        ("for=[2001:db8::1]", [None]),  # brackets need quotes: not a token
        ('for="[2001:db8::1]:80', [None]),  # no closing quote
        ("for=192.0.2.1;for=192.0.2.2", [None]),  # a parameter twice
        ("for=192.0.2.1 proto=http", [None]),
        ("for", [None]),
        ("=192.0.2.1", [None]),
        ('for="_bad!"', [None]),
        ('for="192.0.2.1:99999"', [None]),
        ('for="2001:db8::1"', [ip("2001:db8::1")]),  # bare IPv6 quoted: still unambiguous
        # A comma inside a quoted string does not split elements.
        ('for=192.0.2.1;ext="a,b", for=10.0.0.1', [ip("192.0.2.1"), ip("10.0.0.1")]),
        ('for=192.0.2.1;ext="a\\"b,c"', [ip("192.0.2.1")]),
        ("", [None]),
    ],
)
def test_forwarded_for_hops(value: str, hops: list) -> None:
    assert forwarded([value]) == hops


def test_forwarded_lines_are_one_list() -> None:
    assert forwarded(["for=192.0.2.1", "for=10.0.0.1"]) == [ip("192.0.2.1"), ip("10.0.0.1")]


PROXIES = parse_networks(["10.0.0.0/8", "fd00::/8", "127.0.0.1"])


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    clients = ClientAddresses()
    assert clients.of(scope("198.51.100.7", ("X-Forwarded-For", "192.0.2.1"))) == "198.51.100.7"
    assert clients.of(scope("127.0.0.1", ("Forwarded", "for=192.0.2.1"))) == "127.0.0.1"


def test_an_untrusted_peers_header_is_ignored() -> None:
    clients = ClientAddresses(PROXIES)
    assert clients.of(scope("198.51.100.7", ("X-Forwarded-For", "192.0.2.1"))) == "198.51.100.7"


@pytest.mark.parametrize(
    ("chain", "client"),
    [
        ("192.0.2.1", "192.0.2.1"),
        # Right-most untrusted: what the client wrote itself (left) does not count.
        ("1.1.1.1, 192.0.2.1", "192.0.2.1"),
        ("1.1.1.1, 192.0.2.1, 10.1.2.3", "192.0.2.1"),
        ("1.1.1.1, 192.0.2.1:5555, 10.1.2.3:80, 127.0.0.1", "192.0.2.1"),
        # Every hop trusted: the left-most.
        ("10.9.9.9, 10.1.2.3", "10.9.9.9"),
        # A hop of unknown address stops the walk at the trusted proxy to its right.
        ("192.0.2.1, garbage, 10.1.2.3", "10.1.2.3"),
        ("192.0.2.1, 10.1.2.3, ", "10.0.0.5"),
        ("", "10.0.0.5"),
        # IPv6 clients count per /64.
        ("2001:db8:1:2:aaaa::1, fd00::1", "2001:db8:1:2::/64"),
        ("[2001:db8:1:2:bbbb::9]:443", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
    ],
)
def test_x_forwarded_for_from_a_trusted_proxy(chain: str, client: str) -> None:
    clients = ClientAddresses(PROXIES)
    assert clients.of(scope("10.0.0.5", ("X-Forwarded-For", chain))) == client


def test_several_x_forwarded_for_lines_are_read_in_order() -> None:
    clients = ClientAddresses(PROXIES)
    request = scope(
        "10.0.0.5", ("X-Forwarded-For", "192.0.2.1"), ("X-Forwarded-For", "198.51.100.2, 10.0.0.9")
    )
    assert clients.of(request) == "198.51.100.2"


def test_forwarded_from_a_trusted_proxy() -> None:
    clients = ClientAddresses(PROXIES, "forwarded")
    assert clients.of(scope("10.0.0.5", ("Forwarded", "for=1.1.1.1, for=192.0.2.1"))) == (
        "192.0.2.1"
    )
    assert clients.of(scope("10.0.0.5", ("Forwarded", 'for="_abc", for=10.0.0.7'))) == "_abc"
    assert clients.of(scope("10.0.0.5", ("Forwarded", "for=unknown"))) == "10.0.0.5"
    # The header not chosen is a client's to write: ignored.
    assert clients.of(scope("10.0.0.5", ("X-Forwarded-For", "192.0.2.1"))) == "10.0.0.5"
    assert ClientAddresses(PROXIES).of(scope("10.0.0.5", ("Forwarded", "for=192.0.2.1"))) == (
        "10.0.0.5"
    )


def test_a_trusted_ipv4_proxy_behind_a_dual_stack_socket() -> None:
    clients = ClientAddresses(PROXIES)
    assert clients.of(scope("::ffff:10.0.0.5", ("X-Forwarded-For", "192.0.2.1"))) == "192.0.2.1"


def test_peers_without_an_ip_address() -> None:
    clients = ClientAddresses(PROXIES)
    assert clients.of(scope(None)) == "unknown"
    assert clients.of(scope("testclient", ("X-Forwarded-For", "192.0.2.1"))) == "testclient"
    assert clients.of(scope("2001:db8::5")) == "2001:db8::/64"


def test_the_setting() -> None:
    settings = Settings(trusted_proxies=" 10.0.0.0/8, 192.0.2.7 ,::1,", proxy_header="Forwarded")
    assert settings.trusted_proxies == ["10.0.0.0/8", "192.0.2.7/32", "::1/128"]
    assert settings.proxy_header == "forwarded"
    assert Settings().trusted_proxies == []
    bad = re.escape("not an IP address or CIDR range: 'proxy.local'")
    with pytest.raises(ValidationError, match=bad):
        Settings(trusted_proxies="10.0.0.1,proxy.local")
    with pytest.raises(ValidationError):
        Settings(proxy_header="x-real-ip")


async def test_anonymous_streams_count_per_address_and_tokens_per_token() -> None:
    slots = SseSlots(2, 5, 1, per_address=1, clients=ClientAddresses(PROXIES))
    one, two = scope("192.0.2.1"), scope("192.0.2.2")
    release = slots.acquire(ANONYMOUS, one, "consume")
    with pytest.raises(TooManyRequests, match="this client address has too many"):
        slots.acquire(ANONYMOUS, one, "consume")
    slots.acquire(ANONYMOUS, two, "consume")
    # A token's streams count against the token wherever they come from.
    alice = Principal("alice")
    slots.acquire(alice, one, "consume")
    slots.acquire(alice, two, "consume")
    with pytest.raises(TooManyRequests, match="this token has too many"):
        slots.acquire(alice, scope("192.0.2.3"), "consume")
    # A token named like an address is not that address.
    slots.acquire(Principal("192.0.2.1"), scope("192.0.2.9"), "consume")
    with pytest.raises(TooManyRequests, match="this gateway has too many"):
        slots.acquire(ANONYMOUS, scope("192.0.2.4"), "consume")
    await release()
    await release()  # idempotent
    assert slots.total == 4
    slots.acquire(ANONYMOUS, one, "consume")
