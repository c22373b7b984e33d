"""Tokens and their grants, as loaded from ``JSGW_AUTH_FILE`` (YAML or JSON).

The model follows Consul's ACLs: a token carries rules on resource prefixes, the most
specific rule that matches a resource decides, and nothing is allowed by default.

```yaml
tokens:
  - name: orders-service
    sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
    rules:
      - {resource: "stream:ORDERS", actions: [read, write]}
      - {resource: "kv:USERS/1234.", actions: [read]}
      - {resource: "kv:USERS/1234.secret", actions: []}     # more specific: deny
      - {resource: "consumer:ORDERS/*", actions: [consume]}
```

Resources: ``kv:<bucket>[/<key-prefix>]``, ``stream:<name>[/<subject-prefix>]``,
``consumer:<stream>/<consumer>``, ``obj:<bucket>[/<object-name-prefix>]`` (object buckets);
names may use ``*`` (any characters), prefixes are plain.
Core NATS (publish, request, subscribe) has ``subject:<subject-prefix>`` (``subject:*``: every
subject): the prefix is plain text as a stream rule's is (``subject:orders.eu`` covers
``orders.europe``), and held as a rule on the one name ``*``, so it ranks as those do.
Tokens are stored as SHA-256 hex digests (or ``token`` in clear text, for tests and demos).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

log = logging.getLogger("jsgw.auth")

Action = Literal["read", "write", "admin", "consume"]
ACTIONS: frozenset[str] = frozenset({"read", "write", "admin", "consume"})
KINDS = ("kv", "stream", "consumer", "obj", "subject")
SUBJECTS = "*"  # the name of every subject: pattern (and resource), which only prefixes tell apart


class PolicyError(ValueError):
    pass


class RuleModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resource: str
    actions: list[Action] = Field(default_factory=list)

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        parse_pattern(value)
        return value


class TokenModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    token: str | None = Field(default=None, min_length=16)
    client_cert: str | None = Field(
        default=None, min_length=3, description="RFC 4514 subject of a client certificate"
    )
    rules: list[RuleModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_secret(self) -> TokenModel:
        if self.sha256 is not None and self.token is not None:
            raise ValueError(f"token {self.name!r}: give sha256 or token, not both")
        if self.sha256 is None and self.token is None and self.client_cert is None:
            raise ValueError(f"token {self.name!r}: give sha256, token or client_cert")
        return self


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[TokenModel] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Pattern:
    kind: str
    name: str  # a glob for the bucket / stream / "stream/consumer"
    prefix: str | None

    def specificity(self) -> tuple[int, int, int, int]:
        """Literal names beat globs, longer names beat shorter, then the longest prefix wins."""
        return (
            int("*" not in self.name),
            len(self.name.replace("*", "")),
            int(self.prefix is not None),
            len(self.prefix or ""),
        )

    def text(self) -> str:
        """As the auth file spells it: ``kv:USERS/1234.``, ``subject:orders.``."""
        if self.kind == "subject":
            return f"subject:{'*' if self.prefix is None else self.prefix}"
        return f"{self.kind}:{self.name}" + (f"/{self.prefix}" if self.prefix is not None else "")


def parse_pattern(resource: str) -> Pattern:
    kind, sep, rest = resource.partition(":")
    if not sep or kind not in KINDS or not rest:
        raise PolicyError(
            f"resource {resource!r}: expected kv:, stream:, consumer:, obj: or subject: and a name"
        )
    if kind == "consumer":
        stream, slash, consumer = rest.partition("/")
        if not slash or not stream or not consumer:
            raise PolicyError(f"resource {resource!r}: expected consumer:<stream>/<consumer>")
        return Pattern(kind, rest, None)
    if kind == "subject":
        return Pattern(kind, SUBJECTS, None if rest == "*" else rest)
    name, slash, prefix = rest.partition("/")
    return Pattern(kind, name, prefix if slash else None)


@dataclass(frozen=True, slots=True)
class Resource:
    """What a request touches: ``kind``, the bucket/stream (or "stream/consumer"), a key or
    subject."""

    kind: str
    name: str
    item: str | None = None

    def __str__(self) -> str:
        if self.kind == "subject":
            return f"subject:{self.item or '*'}"
        return f"{self.kind}:{self.name}" + (f"/{self.item}" if self.item is not None else "")


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: Pattern
    actions: frozenset[str]
    # For a rule derived from a kv: rule (:func:`kv_twins`), that rule's pattern.
    origin: Pattern | None = None

    def matches(self, resource: Resource) -> bool:
        p = self.pattern
        if p.kind != resource.kind or not fnmatch.fnmatchcase(resource.name, p.name):
            return False
        if p.prefix is None:
            return True
        return resource.item is not None and resource.item.startswith(p.prefix)


KV_STREAM_PREFIX = "KV_"  # a bucket's data is also stream KV_<bucket>, subjects $KV.<bucket>.<key>
OBJ_STREAM_PREFIX = "OBJ_"  # an object bucket's is stream OBJ_<bucket>, subjects $O.<bucket>.>
BUCKET_STREAMS = (KV_STREAM_PREFIX, OBJ_STREAM_PREFIX)


def kv_twins(rules: tuple[Rule, ...], stream: str) -> list[Rule]:
    """The kv: rules that concern the bucket behind ``stream`` (``KV_<bucket>``), as rules on
    the stream: ``kv:USERS/1234.`` becomes ``stream:KV_USERS/$KV.USERS.1234.``. A bucket's
    keys are reachable as that stream's messages too (Direct Get, consumers, stream admin),
    and what the kv: rules deny must stay denied there.

    The same for object buckets (``OBJ_<bucket>``): ``obj:FILES`` becomes
    ``stream:OBJ_FILES``. Object names are base64 in the subjects and an object's chunks do
    not carry its name, so a rule on some objects (``obj:FILES/private/``) cannot be
    translated; it becomes a rule that denies every subject of the stream (reachable through
    the obj routes only)."""
    if stream.startswith(OBJ_STREAM_PREFIX):
        return _obj_twins(rules, stream[len(OBJ_STREAM_PREFIX) :])
    if not stream.startswith(KV_STREAM_PREFIX):
        return []
    bucket = stream[len(KV_STREAM_PREFIX) :]
    twins = []
    for rule in rules:
        p = rule.pattern
        if p.kind == "kv" and fnmatch.fnmatchcase(bucket, p.name):
            prefix = None if p.prefix is None else f"$KV.{bucket}.{p.prefix}"
            name = KV_STREAM_PREFIX + p.name
            twins.append(Rule(Pattern("stream", name, prefix), rule.actions, origin=p))
    return twins


def _obj_twins(rules: tuple[Rule, ...], bucket: str) -> list[Rule]:
    twins = []
    for rule in rules:
        p = rule.pattern
        if p.kind == "obj" and fnmatch.fnmatchcase(bucket, p.name):
            name = OBJ_STREAM_PREFIX + p.name
            if p.prefix is None:
                twins.append(Rule(Pattern("stream", name, None), rule.actions, origin=p))
            else:
                twins.append(Rule(Pattern("stream", name, f"$O.{bucket}."), frozenset(), origin=p))
    return twins


def decisive(rules: list[Rule] | tuple[Rule, ...], resource: Resource) -> Rule | None:
    """The most specific of ``rules`` that matches ``resource``, which decides for it."""
    best: Rule | None = None
    for rule in rules:
        if rule.matches(resource) and (
            best is None or rule.pattern.specificity() > best.pattern.specificity()
        ):
            best = rule
    return best


@dataclass(frozen=True)
class Principal:
    name: str
    rules: tuple[Rule, ...] = ()
    anonymous: bool = False

    def allows(self, action: str, resource: Resource) -> bool:
        """The most specific matching rule decides; no rule, no access. On a bucket's stream
        (``KV_<bucket>``) the kv: rules that concern the item must allow it as well."""
        if self.anonymous:
            return True
        best = decisive(self.rules, resource)
        if best is None or action not in best.actions:
            return False
        if resource.kind == "stream" and resource.name.startswith(BUCKET_STREAMS):
            twin = decisive(kv_twins(self.rules, resource.name), resource)
            return twin is None or action in twin.actions
        return True

    def allows_some(self, action: str, kind: str) -> bool:
        """Some rule of ``kind`` grants ``action`` (on what, the caller checks next)."""
        if self.anonymous:
            return True
        return any(r.pattern.kind == kind and action in r.actions for r in self.rules)

    def item_rules(self, kind: str, name: str) -> list[Rule]:
        """The rules with an item prefix that concern bucket/stream ``name`` (for a bucket's
        stream, the kv: rules' twins too)."""
        own = [
            rule
            for rule in self.rules
            if rule.pattern.kind == kind
            and rule.pattern.prefix is not None
            and fnmatch.fnmatchcase(name, rule.pattern.name)
        ]
        if kind == "stream":
            own += [r for r in kv_twins(self.rules, name) if r.pattern.prefix is not None]
        return own

    def allows_all(self, action: str, kind: str, name: str) -> bool:
        """``action`` on every item of one bucket/stream: the whole is granted, and no more
        specific rule (``kv:USERS`` read, ``kv:USERS/1234.secret`` none) takes it away from
        some items. Allowing the whole alone says nothing about such carve-outs."""
        if self.anonymous:
            return True
        if not self.allows(action, Resource(kind, name, None)):
            return False
        # An item is denied if the rule decisive for it lacks the action; the first item a
        # prefix rule decides is the prefix itself.
        return all(
            self.allows(action, Resource(kind, name, rule.pattern.prefix))
            for rule in self.item_rules(kind, name)
        )

    def allows_every(self, action: str, kind: str) -> bool:
        """``action`` on every bucket/stream of ``kind`` and on all of each: a ``<kind>:*``
        rule grants it and no rule of the kind (nor, for streams, a kv: rule, which concerns
        a bucket's stream) lacks it."""
        if self.anonymous:
            return True
        if not self.allows(action, Resource(kind, "*")):
            return False
        kinds = {kind, "kv"} if kind == "stream" else {kind}
        return all(action in rule.actions for rule in self.rules if rule.pattern.kind in kinds)

    def readable_prefixes(self, kind: str, name: str, action: str = "read") -> list[str] | None:
        """Item prefixes this principal may ``action`` in one bucket/stream.

        ``None`` means everything; ``[]`` nothing. Used to narrow wildcard reads: a result
        item is kept only when :meth:`allows` says so, so deny rules still apply.
        """
        if self.allows_all(action, kind, name):
            return None
        # Only the token's own rules on ``kind`` grant; a bucket's kv: rules can take items
        # of its stream away (checked item by item through :meth:`allows`), never give them.
        prefixes = [
            rule.pattern.prefix
            for rule in self.rules
            if rule.pattern.kind == kind
            and rule.pattern.prefix is not None
            and action in rule.actions
            and fnmatch.fnmatchcase(name, rule.pattern.name)
        ]
        if self.allows(action, Resource(kind, name, None)):
            # The whole is granted with carve-outs: any item but those may be read, so the
            # caller must check each one (None here would return the denied ones too).
            prefixes.append("")
        return sorted(set(prefixes))


ANONYMOUS = Principal("anonymous", anonymous=True)


@dataclass
class Policy:
    by_digest: dict[bytes, Principal] = field(default_factory=dict)
    by_cert: dict[str, Principal] = field(default_factory=dict)

    @property
    def principals(self) -> list[Principal]:
        return [*self.by_digest.values(), *self.by_cert.values()]

    def authenticate(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        # Every digest is compared, in constant time, so timing tells nothing.
        for known, principal in self.by_digest.items():
            if hmac.compare_digest(known, digest):
                found = principal
        return found


def load(path: Path, *, warn: bool = True) -> Policy:
    """The tokens of an auth file; PolicyError names what is wrong with it. With ``warn``,
    logs a warning for each rule that can never take effect (app/auth/review.py)."""
    try:
        text = path.read_text()
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        parsed = PolicyFile.model_validate(data or {})
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise PolicyError(f"{path}: {exc}") from None
    policy = Policy()
    for token in parsed.tokens:
        rules = tuple(Rule(parse_pattern(r.resource), frozenset(r.actions)) for r in token.rules)
        principal = Principal(token.name, rules)
        if token.sha256 or token.token:
            digest = (
                bytes.fromhex(token.sha256)
                if token.sha256
                else hashlib.sha256((token.token or "").encode()).digest()
            )
            policy.by_digest[digest] = principal
        if token.client_cert:
            policy.by_cert[token.client_cert] = principal
    if warn:
        from app.auth.review import ineffective_rules  # it builds on this module

        for warning in ineffective_rules(policy):
            log.warning("%s: %s", path, warning)
    return policy
