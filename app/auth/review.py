"""Reviewing an auth file: rules that can never take effect, and which rule decides a request.

The most specific matching rule decides (app/auth/policy.py): a literal name beats a ``*`` name
before prefixes are compared, so ``kv:CACHE_*/secret.`` with no actions never takes ``read``
away in bucket ``CACHE_A`` when ``kv:CACHE_A`` grants it, however long its prefix. Such rules
are easy to write and do nothing; :func:`ineffective_rules` names them when the file is loaded,
and :func:`explain` says for one request which rule decides and why (``jsgw auth explain``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass

from app.auth.policy import (
    ACTIONS,
    KINDS,
    SUBJECTS,
    Pattern,
    Policy,
    PolicyError,
    Principal,
    Resource,
    Rule,
)


def rule_text(rule: Rule) -> str:
    """A rule as the auth file spells it: ``kv:USERS/1234. [read, write]``."""
    return f"{rule.pattern.text()} {_actions(rule)}"


def _actions(rule: Rule) -> str:
    return f"[{', '.join(sorted(rule.actions))}]"


def _numbered(principal: Principal, rule: Rule) -> str:
    index = next(i for i, r in enumerate(principal.rules, 1) if r is rule)
    return f"rule {index} ({rule_text(rule)})"


# -- which rule beats which ----------------------------------------------------------------


def beats(winner: tuple[int, Rule], loser: tuple[int, Rule]) -> bool:
    """Whether ``winner`` (index, rule) decides over ``loser`` where both match: higher
    specificity, or the same and listed first (as :meth:`Principal.allows` picks)."""
    (wi, w), (li, lo) = winner, loser
    ws, ls = w.pattern.specificity(), lo.pattern.specificity()
    return ws > ls or (ws == ls and wi < li)


def why(winner: Rule, loser: Rule) -> str:
    """Why ``winner`` is more specific than ``loser``, in the order the comparison runs."""
    w, lo = winner.pattern, loser.pattern
    ws, ls = w.specificity(), lo.specificity()
    if ws[0] != ls[0]:
        return f"the literal name {w.name!r} beats the pattern {lo.name!r}, whatever the prefixes"
    if ws[1] != ls[1]:
        return f"the longer name {w.name!r} beats {lo.name!r}, whatever the prefixes"
    if ws[2] != ls[2]:
        return f"a prefix ({w.prefix!r}) beats none"
    if ws[3] != ls[3]:
        return f"the longer prefix {w.prefix!r} beats {lo.prefix!r}"
    return "as specific, and listed first"


# -- pattern containment -----------------------------------------------------------------------

_PLURAL = {
    "kv": "buckets",
    "stream": "streams",
    "consumer": "consumers",
    "obj": "object buckets",
    "subject": "subjects",
}
_PLAIN_GLOB = re.compile(r"[^?\[\]]*")
_ANY = "\0"  # stands for what a '*' matches; no name contains it


def _names_within(inner: str, outer: str) -> bool:
    """Every name ``inner`` matches is matched by ``outer`` (globs with ``*``)."""
    if inner == outer or outer == "*":
        return True
    if not (_PLAIN_GLOB.fullmatch(inner) and _PLAIN_GLOB.fullmatch(outer)):
        return False  # '?' and '[...]': not worked out, never claimed
    # With each '*' of inner as one symbol that only a '*' of outer can match, outer matching
    # it means outer matches every way of filling inner's stars (and conversely).
    return fnmatch.fnmatchcase(inner.replace("*", _ANY), outer)


def _covers(outer: Pattern, inner: Pattern) -> bool:
    """``outer`` matches every resource ``inner`` matches."""
    if outer.kind != inner.kind or not _names_within(inner.name, outer.name):
        return False
    if outer.prefix is None:
        return True
    return inner.prefix is not None and inner.prefix.startswith(outer.prefix)


# -- rules that never take effect -------------------------------------------------------------


def ineffective_rules(policy: Policy) -> list[str]:
    """Warnings about each principal's rules that never decide, or never where they were
    likely meant to (see the module's docstring), and about principals sharing a name."""
    warnings: list[str] = []
    names: dict[str, int] = {}
    for principal in policy.principals:
        names[principal.name] = names.get(principal.name, 0) + 1
        warnings += [f"token {principal.name!r}: {w}" for w in _principal_warnings(principal)]
    for name, count in names.items():
        if count > 1:
            warnings.append(
                f"{count} tokens are named {name!r}: rate limits and `jsgw auth explain` "
                "take them as one"
            )
    return warnings


def _principal_warnings(principal: Principal) -> Iterator[str]:
    rules = list(enumerate(principal.rules))
    for i, rule in rules:
        # 1. Another rule matches everything this one does and always decides over it.
        shadow = next(
            (
                (j, other)
                for j, other in rules
                if j != i and _covers(other.pattern, rule.pattern) and beats((j, other), (i, rule))
            ),
            None,
        )
        if shadow is not None:
            _, other = shadow
            same = "; it grants the same" if other.actions == rule.actions else ""
            yield (
                f"{_numbered(principal, rule)} never takes effect: "
                f"{_numbered(principal, other)} matches everything it does and decides "
                f"({why(other, rule)}){same}"
            )
            continue
        # 2. A rule with a '*' name and a prefix never decides in the buckets/streams that a
        # rule with a more specific name (a literal one, or a longer pattern) also matches with
        # a shorter prefix or none: names are compared before prefixes. Say so where what
        # decides there differs from it.
        p = rule.pattern
        if "*" not in p.name or p.prefix is None:
            continue
        names = {
            o.pattern.name
            for o in principal.rules
            if o.pattern.kind == p.kind
            and o.pattern.specificity()[:2] > p.specificity()[:2]
            and _names_within(o.pattern.name, p.name)
        }
        for name in sorted(names):
            there = Resource(p.kind, name.replace("*", _ANY), p.prefix)
            decisive = explain(principal, "read", there).decisive
            if decisive is None or decisive[1] is rule or decisive[1].actions == rule.actions:
                continue
            other = decisive[1]
            where = f"{p.kind} {name!r}" if "*" not in name else f"the {_PLURAL[p.kind]} {name!r}"
            yield (
                f"{_numbered(principal, rule)} never decides in {where}: "
                f"{_numbered(principal, other)} does, for the items under {p.prefix!r} "
                f"({why(other, rule)}), so they get {_actions(other)} there, not "
                f"{_actions(rule)}; add {p.kind}:{name}/{p.prefix} {_actions(rule)} to make it "
                "hold there"
            )


# -- explaining one decision ---------------------------------------------------------------


@dataclass(frozen=True)
class Explanation:
    principal: Principal
    action: str
    resource: Resource
    allowed: bool
    matching: list[tuple[int, Rule]]  # (1-based index, rule), the deciding rule first
    carve_outs: list[tuple[int, Rule]]  # for a whole bucket/stream: rules taking items away

    @property
    def decisive(self) -> tuple[int, Rule] | None:
        return self.matching[0] if self.matching else None

    def lines(self) -> list[str]:
        verdict = "ALLOWED" if self.allowed else "DENIED"
        out = [f"{verdict}: {self.action} on {self.resource} for token {self.principal.name!r}"]
        if self.principal.anonymous:
            return [*out, "  authentication is off: every request is allowed"]
        if not self.matching:
            out.append("  no rule matches: nothing is allowed by default")
            return out
        index, rule = self.matching[0]
        has = "grants" if self.action in rule.actions else "does not grant"
        out.append(f"  decided by rule {index}: {rule_text(rule)}, which {has} {self.action}")
        for other_index, other in self.matching[1:]:
            out.append(f"  over rule {other_index}: {rule_text(other)}: {why(rule, other)}")
        for other_index, other in self.carve_outs:
            out.append(
                f"  but rule {other_index}: {rule_text(other)} takes {self.action} away from "
                f"the items under {other.pattern.prefix!r}, so requests that need the whole "
                f"{self.resource.kind} (reads by sequence, stream-wide listings) are refused"
            )
        return out


def parse_resource(text: str) -> Resource:
    """``kv:USERS/1234.name``, ``stream:ORDERS``, ``consumer:ORDERS/worker-3``,
    ``subject:orders.eu.1``."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS or not rest:
        raise PolicyError(
            f"resource {text!r}: expected kv:, stream:, consumer:, obj: or subject: and a name"
        )
    if kind == "subject":
        return Resource(kind, SUBJECTS, rest)
    if kind == "consumer":
        if rest.count("/") != 1 or rest.startswith("/") or rest.endswith("/"):
            raise PolicyError(f"resource {text!r}: expected consumer:<stream>/<consumer>")
        return Resource(kind, rest)
    name, slash, item = rest.partition("/")
    return Resource(kind, name, item if slash else None)


def explain(principal: Principal, action: str, resource: Resource) -> Explanation:
    """Which of ``principal``'s rules decides ``action`` on ``resource``, and the others that
    match (best first), as :meth:`Principal.allows` decides."""
    if action not in ACTIONS:
        raise PolicyError(f"action {action!r}: expected one of {', '.join(sorted(ACTIONS))}")
    if principal.anonymous:
        return Explanation(principal, action, resource, True, [], [])
    matching = [(i, r) for i, r in enumerate(principal.rules, 1) if r.matches(resource)]
    ranked: list[tuple[int, Rule]] = []
    for candidate in matching:  # stable: the first of equals stays ahead
        at = next((k for k, held in enumerate(ranked) if beats(candidate, held)), len(ranked))
        ranked.insert(at, candidate)
    allowed = principal.allows(action, resource)
    carve_outs: list[tuple[int, Rule]] = []
    if resource.item is None and resource.kind != "consumer" and allowed:
        # As Principal.allows_all: an item prefix whose decisive rule lacks the action.
        for rule in principal.rules:
            p = rule.pattern
            if p.kind != resource.kind or p.prefix is None:
                continue
            if not fnmatch.fnmatchcase(resource.name, p.name):
                continue
            item = Resource(resource.kind, resource.name, p.prefix)
            if principal.allows(action, item):
                continue
            decisive = explain(principal, action, item).decisive
            if decisive is not None and decisive not in carve_outs:
                carve_outs.append(decisive)
    return Explanation(principal, action, resource, allowed, ranked, carve_outs)
