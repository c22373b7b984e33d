"""Which action on which resource a route needs, checked before its handler runs.

Each route declares its :class:`Need` where it is defined (``access=`` of
:class:`app.routing.Router`'s decorators); the route object carries it, :func:`authorize`
reads it from the matched route, and the OpenAPI document shows it (``x-jsgw-access``). A
route without one fails start-up (:func:`app.routing.check_declared`), and with auth on it
would be refused (default deny). The rule is read from the request head alone: the path
parameters and, for Direct Get, the query. Routes that read with wildcards (listings,
watches, multi reads) need only some access to the bucket or stream here; their handlers
narrow the results to what the principal may read.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from app import errors
from app.auth.guard import SSE_COOKIE, SSE_QUERY, Authenticator
from app.auth.policy import ANONYMOUS, SUBJECTS, Principal, Resource, Rule, decisive, kv_twins
from app.auth.subjects import confined, head, reaches
from app.errors import ErrorCode
from app.tls import client_cert_name

Params = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Target:
    """What a route acts on, read from the request head; ``pattern`` names it in the auth
    file's terms for the OpenAPI document."""

    pattern: str
    of: Callable[[Params, Request], Resource]

    def __call__(self, params: Params, request: Request) -> Resource:
        return self.of(params, request)


@dataclass(frozen=True, slots=True)
class Need:
    action: str
    resource: Target | None = None
    narrowed: bool = False  # some access in the bucket/stream is enough; the handler narrows
    sse: bool = False  # may authenticate with a short-lived SSE token

    def openapi(self) -> dict[str, Any]:
        """The rule as the OpenAPI document shows it (``x-jsgw-access``)."""
        rule: dict[str, Any] = {"action": self.action}
        if self.resource is not None:
            rule["resource"] = self.resource.pattern
        return {**rule, "narrowed": self.narrowed, "sse": self.sse}


def _stream(p: Params, _: Request) -> Resource:
    return Resource("stream", p["stream"])


def _stream_subject(p: Params, _: Request) -> Resource:
    return Resource("stream", p["stream"], p["subject"])


def _direct(p: Params, request: Request) -> Resource:
    q = request.query_params
    subject = q.get("last_by_subj") or q.get("next_by_subj")
    return Resource("stream", p["stream"], subject)


def _stream_filter(p: Params, request: Request) -> Resource:
    # What every subject of the filter starts with; a wildcard-only filter reads the whole
    # stream. Deny rules deeper than that text are checked by the handler (read_denial).
    subject = request.query_params.get("subject")
    return Resource("stream", p["stream"], head(subject) or None if subject else None)


def _bucket(p: Params, _: Request) -> Resource:
    return Resource("kv", p["bucket"])


def _key(p: Params, _: Request) -> Resource:
    return Resource("kv", p["bucket"], p["key"])


def _obj_bucket(p: Params, _: Request) -> Resource:
    return Resource("obj", p["bucket"])


def _object(p: Params, _: Request) -> Resource:
    return Resource("obj", p["bucket"], p["name"])


def _consumer(p: Params, _: Request) -> Resource:
    return Resource("consumer", f"{p['stream']}/{p['consumer']}")


def _subject(p: Params, _: Request) -> Resource:
    return Resource("subject", SUBJECTS, p["subject"])


def _subject_filter(p: Params, _: Request) -> Resource:
    # What every subject of the filter starts with; the handler narrows (subject_reader).
    return Resource("subject", SUBJECTS, head(p["subject"]) or None)


# The consumer a push subscription delivers is named in its body or its stored record, not in
# the request head: the route needs the action on some consumer (decided from the head), and
# its handler checks the subscription's own (:func:`require`).
SOME_CONSUMER = Resource("consumer", "*")


def _subscription(_: Params, __: Request) -> Resource:
    return SOME_CONSUMER


STREAM = Target("stream:{stream}", _stream)
STREAM_SUBJECT = Target("stream:{stream}/{subject}", _stream_subject)
DIRECT = Target("stream:{stream}/{last_by_subj|next_by_subj}", _direct)
STREAM_FILTER = Target("stream:{stream}/{subject}", _stream_filter)
BUCKET = Target("kv:{bucket}", _bucket)
KEY = Target("kv:{bucket}/{key}", _key)
CONSUMER = Target("consumer:{stream}/{consumer}", _consumer)
OBJ_BUCKET = Target("obj:{bucket}", _obj_bucket)
OBJECT = Target("obj:{bucket}/{name}", _object)
SUBJECT = Target("subject:{subject}", _subject)
SUBJECT_FILTER = Target("subject:{subject}", _subject_filter)
SUBSCRIPTION = Target("consumer:{subscription's stream}/{subscription's consumer}", _subscription)

AUTHENTICATED = Need("authenticated")
PUBLIC = Need("public")


def _forbidden() -> errors.Forbidden:
    # The same answer whether or not the resource exists.
    return errors.Forbidden(ErrorCode.AUTH_FORBIDDEN, "this token may not do that")


def check(principal: Principal, need: Need, resource: Resource | None) -> None:
    if need.action in ("public", "authenticated") or resource is None:
        return
    if resource is SOME_CONSUMER:
        if principal.allows_some(need.action, "consumer"):
            return
        raise _forbidden()
    if resource.item is None and need.action == "read" and not need.narrowed:
        # A read of the whole (by sequence: any subject may come back) needs every item;
        # a deny rule on some subjects of the stream takes it away.
        allowed = principal.allows_all("read", resource.kind, resource.name)
    else:
        allowed = principal.allows(need.action, resource)
    if allowed:
        return
    if need.narrowed and principal.readable_prefixes(resource.kind, resource.name, need.action):
        return
    raise _forbidden()


def require(principal: Principal, action: str, resource: Resource) -> None:
    """For handlers that check items themselves (publish subjects, results of wildcard reads)."""
    if not principal.allows(action, resource):
        raise _forbidden()


# -- what listings and /v1/info show -----------------------------------------------------


def sees_consumer(principal: Principal, stream: str, consumer: str) -> bool:
    """Whether a consumer shows in listings: the token may get its info (consume) or
    administer it."""
    resource = Resource("consumer", f"{stream}/{consumer}")
    return principal.allows("consume", resource) or principal.allows("admin", resource)


def require_sees_consumer(principal: Principal, stream: str, consumer: str) -> None:
    """403 unless the consumer would show in the token's listings (:func:`sees_consumer`)."""
    if not sees_consumer(principal, stream, consumer):
        raise _forbidden()


def sees_account(principal: Principal) -> bool:
    """Whether the token may see account-wide figures (how many streams and consumers, the
    storage they use, the API's counters) and the gateway's connections: it may read every
    stream (a ``stream:*`` rule with ``read``, and no stream rule without it)."""
    if principal.anonymous:
        return True
    streams = [rule for rule in principal.rules if rule.pattern.kind == "stream"]
    return any(
        rule.pattern.name == "*" and rule.pattern.prefix is None for rule in streams
    ) and all("read" in rule.actions for rule in streams)


# -- consuming: a consumer grant never reaches past the token's stream rules ---------------


def _rule_sets(principal: Principal, stream: str) -> list[list[Rule]]:
    """The sets of the token's rules that each must let it read what ``stream`` delivers: its
    stream rules, and for a bucket's stream (``KV_<bucket>``) its kv: rules on that bucket."""
    own = [
        rule
        for rule in principal.rules
        if rule.pattern.kind == "stream" and fnmatch.fnmatchcase(stream, rule.pattern.name)
    ]
    return [rules for rules in (own, kv_twins(principal.rules, stream)) if rules]


def concerns_stream(principal: Principal, stream: str) -> bool:
    """Whether any of the token's stream (or, for a bucket's stream, kv:) rules applies to
    ``stream`` (only then can one deny it some subjects a consumer delivers)."""
    return bool(_rule_sets(principal, stream))


def _named(rule: Rule) -> str:
    return (rule.origin or rule.pattern).text()


def consume_denial(
    principal: Principal, stream: str, filters: Sequence[str]
) -> tuple[str, Rule] | None:
    """A filter of a consumer of ``stream`` that reaches subjects the token's stream rules
    deny it to read, with the rule that denies them; None when there is none.

    ``consume`` on a consumer stands on its own where none of the token's stream rules
    applies (a consume-only token reads what its consumers deliver). Where one does, the most
    specific one decides for the subject, as for any read, and must grant ``read``: a rule
    without it (``actions: []``, or ``[write]``) is a deny that a consumer cannot bypass.
    ``filters`` empty: the consumer delivers the whole stream.
    """
    if principal.anonymous:
        return None
    for rules in _rule_sets(principal, stream):
        denied = _denial(rules, stream, filters)
        if denied is not None:
            return denied
    return None


def _denial(rules: list[Rule], stream: str, filters: Sequence[str]) -> tuple[str, Rule] | None:
    # Subjects fall into classes by the longest rule prefix they start with; the rules that
    # match, and so the decisive one, are the same for every subject of a class.
    prefixes = sorted({""} | {r.pattern.prefix for r in rules if r.pattern.prefix is not None})
    for prefix in prefixes:
        rule = decisive(rules, Resource("stream", stream, prefix))
        if rule is None or "read" in rule.actions:
            continue
        deeper = [p for p in prefixes if p != prefix and p.startswith(prefix)]
        for filter_subject in filters or (">",):
            if reaches(filter_subject, prefix) and not any(
                confined(filter_subject, p, prefix) for p in deeper
            ):
                return filter_subject, rule
    return None


def check_consumer(
    principal: Principal, stream: str, consumer: str, filters: Sequence[str]
) -> None:
    """403 when consumer ``stream``/``consumer`` can deliver what a deny takes from the token
    (:func:`consume_denial`), naming the filter and the rule."""
    denied = consume_denial(principal, stream, filters)
    if denied is not None:
        filter_subject, rule = denied
        raise errors.Forbidden(
            ErrorCode.AUTH_FORBIDDEN,
            f"consumer {stream}/{consumer} delivers {filter_subject!r}, which reaches subjects "
            f"that the rule {_named(rule)!r} does not let this token read",
        )


def check_read_filter(principal: Principal, stream: str, filter_subject: str | None) -> None:
    """403 when a read of ``stream`` through ``filter_subject`` (None: all of it) reaches
    subjects that a rule denies the token to read."""
    denied = consume_denial(principal, stream, [filter_subject] if filter_subject else [])
    if denied is not None:
        raise errors.Forbidden(
            ErrorCode.AUTH_FORBIDDEN,
            f"{denied[0]!r} reaches subjects that the rule {_named(denied[1])!r} does not let "
            "this token read",
        )


def check_delivered(principal: Principal, stream: str, consumer: str, subject: str) -> None:
    """403 for a message the consumer delivered that the token may not read: the consumer
    changed (re-created with a broader filter) since its filter was checked."""
    if principal.anonymous:
        return
    for rules in _rule_sets(principal, stream):
        rule = decisive(rules, Resource("stream", stream, subject))
        if rule is not None and "read" not in rule.actions:
            raise errors.Forbidden(
                ErrorCode.AUTH_FORBIDDEN,
                f"consumer {stream}/{consumer} delivered a message that the rule "
                f"{_named(rule)!r} does not let this token read (its filter has changed): "
                "not delivered",
            )


# -- core NATS subscriptions: what a token may read of a subject filter -----------------------


def subject_reader(
    principal: Principal, filter_subject: str, *, whole: bool = False
) -> Callable[[str], bool] | None:
    """How a core subscription to ``filter_subject`` is narrowed to what the token may read.

    None: it may read every subject the filter matches, nothing to check. Otherwise the check
    of each message's subject (the most specific ``subject:`` rule for it must grant read),
    or 403 when no rule that grants read reaches the filter at all. ``whole``: the
    subscription must not be narrowed (a queue group member: a message it dropped would be
    lost to the group's other members too), so anything less than every subject is a 403.
    """
    if principal.anonymous:
        return None
    rules = [rule for rule in principal.rules if rule.pattern.kind == "subject"]
    denied = _subject_denial(rules, filter_subject)
    if denied is None:
        return None
    prefix, rule = denied
    if whole:
        by = f"the rule {_named(rule)!r}" if rule is not None else "no rule (default deny)"
        raise errors.Forbidden(
            ErrorCode.AUTH_FORBIDDEN,
            f"{filter_subject!r} reaches subjects under {prefix!r} that {by} does not let this "
            "token read; a queue group member must read every subject it subscribes to",
        )
    if not any(
        found is not None and "read" in found.actions
        for _, found in _subject_classes(rules, filter_subject)
    ):
        raise _forbidden()

    def visible(subject: str) -> bool:
        return principal.allows("read", Resource("subject", SUBJECTS, subject))

    return visible


def _subject_denial(rules: list[Rule], filter_subject: str) -> tuple[str, Rule | None] | None:
    """A class of subjects the filter reaches that the rules do not let the token read (its
    prefix, and the rule that decides it: None, no rule), or None. As :func:`_denial`, with
    default deny: a subject no rule matches is not readable."""
    for prefix, rule in _subject_classes(rules, filter_subject):
        if rule is None or "read" not in rule.actions:
            return prefix, rule
    return None


def _subject_classes(rules: list[Rule], filter_subject: str) -> Iterator[tuple[str, Rule | None]]:
    """The classes of subjects (by the longest rule prefix they start with) that the filter
    may reach, each with the rule that decides for it (None: none does). May name a class the
    filter does not reach (:func:`confined` is sound, not complete), never leaves one out."""
    prefixes = sorted({""} | {r.pattern.prefix for r in rules if r.pattern.prefix is not None})
    for prefix in prefixes:
        deeper = [p for p in prefixes if p != prefix and p.startswith(prefix)]
        if reaches(filter_subject, prefix) and not any(
            confined(filter_subject, p, prefix) for p in deeper
        ):
            yield prefix, decisive(rules, Resource("subject", SUBJECTS, prefix))


PRINCIPAL = "jsgw.principal"  # the scope key of the admitted request's principal


async def admit(request: Request) -> Principal:
    """Who is calling, and may they use this route on this resource: decided from the request
    head alone, before anything reads the body (:class:`app.routing.Route` and the lean paths
    call it first). The principal is kept in the scope for :func:`authorize`.

    A refusal (401, 403, 429) leaves the body unread; its connection is closed after the
    answer (:class:`app.middleware.BodyLimitMiddleware`), so that the body is not read either
    to keep the connection.
    """
    principal = await _decide(request)
    request.scope[PRINCIPAL] = principal
    return principal


async def authorize(request: Request) -> Principal:
    """The dependency of the routes that take the principal: the one :func:`admit` decided
    (it runs before FastAPI reads the body); decided here when nothing admitted the request."""
    principal: Principal | None = request.scope.get(PRINCIPAL)
    if principal is None:
        principal = await admit(request)
    return principal


async def _decide(request: Request) -> Principal:
    authenticator: Authenticator = request.state.runtime.auth
    need: Need | None = getattr(request.scope.get("route"), "access", None)
    if not authenticator.enabled or need is PUBLIC:
        return ANONYMOUS
    if need is None:
        raise _forbidden()
    sse_token = None
    if need.sse:
        sse_token = request.query_params.get(SSE_QUERY) or request.cookies.get(SSE_COOKIE)
    principal = authenticator.authenticate(
        request.headers.get("authorization"), sse_token, client_cert_name(request.scope)
    )
    authenticator.limit(principal)
    resource = need.resource(request.path_params, request) if need.resource else None
    check(principal, need, resource)
    return principal
