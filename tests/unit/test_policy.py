"""Grant matching: most specific rule wins, default deny, wildcard names."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.auth.policy import (
    ANONYMOUS,
    PolicyError,
    Principal,
    Resource,
    Rule,
    load,
    parse_pattern,
)

POLICY = """
tokens:
  - name: app
    sha256: {digest}
    rules:
      - {{resource: "kv:USERS/1234.", actions: [read, write]}}
      - {{resource: "kv:USERS/1234.secret", actions: []}}
      - {{resource: "kv:CACHE_*", actions: [read]}}
      - {{resource: "stream:ORDERS", actions: [read]}}
      - {{resource: "stream:ORDERS/orders.eu.", actions: [read, write]}}
      - {{resource: "consumer:ORDERS/worker-*", actions: [consume]}}
  - name: admin
    token: "admin-token-0123456789"
    rules:
      - {{resource: "kv:*", actions: [read, write, admin]}}
      - {{resource: "stream:*", actions: [read, write, admin]}}
"""


@pytest.fixture
def policy(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "auth.yaml"
    path.write_text(POLICY.format(digest=hashlib.sha256(b"app-token-0123456789").hexdigest()))
    return load(path)


def test_authenticate(policy) -> None:  # type: ignore[no-untyped-def]
    assert policy.authenticate("app-token-0123456789").name == "app"
    assert policy.authenticate("admin-token-0123456789").name == "admin"
    assert policy.authenticate("app-token-012345678") is None
    assert policy.authenticate("") is None


def test_most_specific_rule_wins(policy) -> None:  # type: ignore[no-untyped-def]
    app = policy.authenticate("app-token-0123456789")
    assert app.allows("read", Resource("kv", "USERS", "1234.name"))
    assert app.allows("write", Resource("kv", "USERS", "1234.name"))
    assert not app.allows("read", Resource("kv", "USERS", "1234.secret"))
    assert not app.allows("read", Resource("kv", "USERS", "1235.name"))
    assert not app.allows("read", Resource("kv", "USERS"))  # the bucket as a whole
    assert not app.allows("admin", Resource("kv", "USERS", "1234.name"))
    assert app.allows("read", Resource("kv", "CACHE_x", "anything"))
    assert not app.allows("write", Resource("kv", "CACHE_x", "anything"))
    assert app.allows("read", Resource("stream", "ORDERS", "orders.us.1"))
    assert app.allows("write", Resource("stream", "ORDERS", "orders.eu.1"))
    assert not app.allows("write", Resource("stream", "ORDERS", "orders.us.1"))
    assert app.allows("consume", Resource("consumer", "ORDERS/worker-1"))
    assert not app.allows("consume", Resource("consumer", "ORDERS/other"))
    assert not app.allows("read", Resource("stream", "PAYMENTS"))


def test_readable_prefixes_narrow(policy) -> None:  # type: ignore[no-untyped-def]
    app = policy.authenticate("app-token-0123456789")
    assert app.readable_prefixes("kv", "USERS") == ["1234."]
    assert app.readable_prefixes("kv", "CACHE_1") is None
    assert app.readable_prefixes("kv", "OTHER") == []
    admin = policy.authenticate("admin-token-0123456789")
    assert admin.readable_prefixes("kv", "USERS") is None


def test_a_deny_rule_under_a_whole_grant_is_no_read_of_everything() -> None:
    rules = (
        Rule(parse_pattern("kv:USERS"), frozenset({"read"})),
        Rule(parse_pattern("kv:USERS/1234.secret"), frozenset()),
        Rule(parse_pattern("kv:*"), frozenset({"read"})),
        Rule(parse_pattern("kv:*/tmp."), frozenset()),  # less specific than kv:USERS
    )
    token = Principal("t", rules)
    assert token.allows("read", Resource("kv", "USERS"))  # the bucket is granted...
    assert not token.allows_all("read", "kv", "USERS")  # ...but not every key of it
    # Wildcard reads must check every key (None would mean "return them all").
    assert token.readable_prefixes("kv", "USERS") == [""]
    assert token.allows("read", Resource("kv", "USERS", "tmp.x"))  # kv:USERS decides
    assert not token.allows_all("read", "kv", "LOGS")  # kv:*/tmp. decides for LOGS
    assert Principal("u", rules[:1]).allows_all("read", "kv", "USERS")
    assert Principal("u", rules[:1]).readable_prefixes("kv", "USERS") is None
    assert ANONYMOUS.allows_all("read", "kv", "USERS")


def test_every_stream_is_a_stream_star_rule_that_no_other_rule_narrows() -> None:
    def token(*rules: tuple[str, set[str]]) -> Principal:
        return Principal("t", tuple(Rule(parse_pattern(r), frozenset(a)) for r, a in rules))

    admin, everything = {"admin"}, {"read", "write", "admin"}
    assert token(("stream:*", admin)).allows_every("admin", "stream")
    assert token(("stream:*", everything), ("kv:*", everything)).allows_every("admin", "stream")
    assert not token(("stream:ORDERS", admin)).allows_every("admin", "stream")
    assert not token(("stream:ORD*", admin)).allows_every("admin", "stream")
    assert not token(("stream:*", admin), ("stream:SECRET", set())).allows_every("admin", "stream")
    # A kv: rule without admin takes admin of its bucket's stream away.
    assert not token(("stream:*", admin), ("kv:*", {"read"})).allows_every("admin", "stream")
    assert not token(("kv:*", everything)).allows_every("admin", "stream")
    assert ANONYMOUS.allows_every("admin", "stream")


@pytest.mark.parametrize(
    "text",
    [
        "tokens: [{name: a, rules: []}]",
        "tokens: [{name: a, token: short}]",
        "tokens: [{name: a, sha256: nothex, rules: []}]",
        "tokens: [{name: a, token: 0123456789abcdef0,"
        " rules: [{resource: 'queue:x', actions: [read]}]}]",
        "tokens: [{name: a, token: 0123456789abcdef0,"
        " rules: [{resource: 'kv:x', actions: [fly]}]}]",
        "tokens: [{name: a, token: 0123456789abcdef0, extra: 1}]",
        "tokens: [{name: a, token: 0123456789abcdef0,"
        " rules: [{resource: 'consumer:x', actions: []}]}]",
        "{not yaml",
    ],
)
def test_bad_files_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "auth.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError):
        load(path)
