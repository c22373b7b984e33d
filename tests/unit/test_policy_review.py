"""Reviewing an auth file (app/auth/review.py): warnings about rules that never take effect when
it is loaded, and ``jsgw auth check`` / ``jsgw auth explain``."""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import cli
from app.auth.policy import Pattern, Policy, Principal, Resource, Rule, load
from app.auth.review import explain, ineffective_rules, parse_resource

AUTH = """
tokens:
  - name: app
    token: "app-token-0123456789"
    rules:
      - {resource: "kv:USERS/1234.", actions: [read, write]}
      - {resource: "kv:USERS/1234.secret", actions: []}
      - {resource: "kv:CACHE_*", actions: [read]}
      - {resource: "kv:CACHE_*/secret.", actions: []}
      - {resource: "kv:CACHE_A", actions: [read]}
      - {resource: "stream:ORDERS", actions: [read]}
      - {resource: "stream:ORDERS/orders.secret.", actions: []}
      - {resource: "consumer:ORDERS/worker-*", actions: [consume]}
      - {resource: "consumer:ORDERS/worker-*", actions: []}
  - name: clean
    token: "clean-token-0123456789"
    rules:
      - {resource: "kv:USERS/1234.", actions: [read, write]}
      - {resource: "kv:USERS/1234.secret", actions: []}
      - {resource: "kv:CACHE_*", actions: [read]}
      - {resource: "kv:CACHE_*/secret.", actions: []}
"""


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth.yaml"
    path.write_text(AUTH)
    return path


def _principal(policy: Policy, name: str) -> Principal:
    return next(p for p in policy.principals if p.name == name)


def test_loading_warns_about_rules_without_effect(
    auth_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="jsgw.auth"):
        load(auth_file)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    glob_deny, duplicate = sorted(warnings)
    # The case: a deny on a '*' bucket never beats a grant naming the bucket.
    assert "token 'app': rule 4 (kv:CACHE_*/secret. [])" in glob_deny
    assert "never decides in kv 'CACHE_A'" in glob_deny
    assert "rule 5 (kv:CACHE_A [read])" in glob_deny
    assert "the literal name 'CACHE_A' beats the pattern 'CACHE_*'" in glob_deny
    assert "add kv:CACHE_A/secret. [] to make it hold there" in glob_deny
    # A rule after one for the same resources.
    assert "rule 9 (consumer:ORDERS/worker-* []) never takes effect" in duplicate
    assert "rule 8 (consumer:ORDERS/worker-* [consume])" in duplicate
    assert all(str(auth_file) in w for w in warnings)


def test_the_fix_the_warning_names_silences_it(auth_file: Path) -> None:
    auth_file.write_text(
        AUTH.replace(
            '      - {resource: "kv:CACHE_A", actions: [read]}\n',
            '      - {resource: "kv:CACHE_A", actions: [read]}\n'
            '      - {resource: "kv:CACHE_A/secret.", actions: []}\n',
        )
    )
    policy = load(auth_file, warn=False)
    warnings = ineffective_rules(policy)
    assert not any("CACHE_A" in w for w in warnings), warnings
    app = _principal(policy, "app")
    assert not app.allows("read", Resource("kv", "CACHE_A", "secret.x"))


def test_config_validation_does_not_warn(auth_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    from app.config import Settings

    with caplog.at_level(logging.WARNING, logger="jsgw.auth"):
        Settings(auth_file=auth_file)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_longer_pattern_beats_a_prefix_too() -> None:
    principal = Principal(
        "p",
        (
            Rule(Pattern("kv", "CACHE_*", "secret."), frozenset()),
            Rule(Pattern("kv", "CACHE_A*", None), frozenset({"read"})),
        ),
    )
    (warning,) = ineffective_rules(Policy(by_cert={"CN=p": principal}))
    assert "never decides in the buckets 'CACHE_A*'" in warning
    assert "the longer name 'CACHE_A*' beats 'CACHE_*'" in warning


def test_duplicate_token_names_are_reported() -> None:
    one, two = Principal("svc", ()), Principal("svc", ())
    warnings = ineffective_rules(Policy(by_digest={b"1": one, b"2": two}))
    assert warnings == [
        "2 tokens are named 'svc': rate limits and `jsgw auth explain` take them as one"
    ]


def test_explain_names_the_deciding_rule_and_why(auth_file: Path) -> None:
    app = _principal(load(auth_file, warn=False), "app")
    denied = explain(app, "read", parse_resource("kv:USERS/1234.secret"))
    assert not denied.allowed
    assert denied.decisive is not None and denied.decisive[0] == 2
    text = "\n".join(denied.lines())
    assert text.startswith("DENIED: read on kv:USERS/1234.secret for token 'app'")
    assert "decided by rule 2: kv:USERS/1234.secret [], which does not grant read" in text
    assert "over rule 1: kv:USERS/1234. [read, write]: the longer prefix" in text

    glob = "\n".join(explain(app, "read", parse_resource("kv:CACHE_A/secret.x")).lines())
    assert glob.startswith("ALLOWED")
    assert "the literal name 'CACHE_A' beats the pattern 'CACHE_*'" in glob

    nothing = explain(app, "write", parse_resource("kv:OTHER/x"))
    assert not nothing.allowed and "no rule matches" in "\n".join(nothing.lines())


def test_explain_on_a_whole_stream_lists_the_carve_outs(auth_file: Path) -> None:
    app = _principal(load(auth_file, warn=False), "app")
    whole = explain(app, "read", parse_resource("stream:ORDERS"))
    assert whole.allowed
    assert [index for index, _ in whole.carve_outs] == [7]
    assert not app.allows_all("read", "stream", "ORDERS")
    assert "requests that need the whole stream" in "\n".join(whole.lines())


@pytest.mark.parametrize(
    ("text", "resource"),
    [
        ("kv:USERS", Resource("kv", "USERS")),
        ("kv:USERS/a/b", Resource("kv", "USERS", "a/b")),
        ("stream:ORDERS/orders.eu.1", Resource("stream", "ORDERS", "orders.eu.1")),
        ("consumer:ORDERS/worker-3", Resource("consumer", "ORDERS/worker-3")),
    ],
)
def test_parse_resource(text: str, resource: Resource) -> None:
    assert parse_resource(text) == resource


@pytest.mark.parametrize("text", ["USERS", "bucket:X", "kv:", "consumer:ORDERS", "consumer:a/b/c"])
def test_parse_resource_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_resource(text)


# -- the claims hold: brute force over a small universe ---------------------------------------

NAMES = ["A", "AB", "B"]
PATTERNS = [*NAMES, "A*", "*", "*B"]
ITEMS = ["x", "x.y", "x.y.z", "w"]
PREFIXES = [None, "x", "x.y", "w"]
ACTION_SETS = [frozenset(), frozenset({"read"}), frozenset({"read", "write"})]

rules = st.builds(
    lambda name, prefix, actions: Rule(Pattern("kv", name, prefix), actions),
    st.sampled_from(PATTERNS),
    st.sampled_from(PREFIXES),
    st.sampled_from(ACTION_SETS),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(rules, min_size=1, max_size=6))
def test_explain_agrees_with_allows_and_warnings_are_true(rule_list: list[Rule]) -> None:
    principal = Principal("p", tuple(rule_list))
    decided_by: set[int] = set()
    for name in NAMES:
        for item in [None, *ITEMS]:
            resource = Resource("kv", name, item)
            for action in ("read", "write"):
                explanation = explain(principal, action, resource)
                assert explanation.allowed == principal.allows(action, resource)
                if explanation.decisive is not None:
                    index, rule = explanation.decisive
                    assert (action in rule.actions) == explanation.allowed
                    decided_by.add(index)
                else:
                    assert not explanation.allowed
    for warning in ineffective_rules(Policy(by_cert={"CN=p": principal})):
        index = int(warning.split("rule ", 1)[1].split(" ", 1)[0])
        if "never takes effect" in warning:
            assert index not in decided_by, warning
        else:  # never decides in the buckets named: none of them is decided by it
            for name in NAMES:
                where = warning.split("never decides in ", 1)[1].split(":", 1)[0]
                pattern = where.rsplit(" ", 1)[1].strip("'")
                if not fnmatchcase(name, pattern):
                    continue
                for item in ITEMS:
                    decisive = explain(principal, "read", Resource("kv", name, item)).decisive
                    assert decisive is None or decisive[0] != index, (warning, name, item)


# -- the commands ----------------------------------------------------------------------------


def test_auth_check_command(auth_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["auth", "check", "--file", str(auth_file)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 2 and "never decides in kv 'CACHE_A'" in out


def test_auth_check_of_a_clean_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = tmp_path / "clean.yaml"
    clean.write_text(
        AUTH.split("  - name: clean\n")[0].split("    rules:\n")[0] + "    rules: []\n"
    )
    assert cli.main(["auth", "check", "--file", str(clean)]) == 0
    assert "every rule can take effect" in capsys.readouterr().out


def test_auth_explain_command(
    auth_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JSGW_AUTH_FILE", str(auth_file))
    assert cli.main(["auth", "explain", "--token", "app", "kv:USERS/1234.name", "write"]) == 0
    assert capsys.readouterr().out.startswith("ALLOWED: write on kv:USERS/1234.name")
    assert cli.main(["auth", "explain", "--token", "app", "kv:USERS/1234.secret", "read"]) == 1
    assert "decided by rule 2" in capsys.readouterr().out
    assert cli.main(["auth", "explain", "--token", "nobody", "kv:USERS", "read"]) == 2
    assert "no token named 'nobody' (tokens: app, clean)" in capsys.readouterr().err
    assert cli.main(["auth", "explain", "--token", "app", "USERS", "read"]) == 2
