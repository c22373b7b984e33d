"""Contract fuzzing: schemathesis drives every operation of the committed spec against a real
gateway and nats-server, with every check it has. Requests valid per the spec must be accepted
(positive data), invalid ones refused (negative data), responses must be what the spec says,
405s must name every method (``Allow``), and the stateful phase follows the spec's links (a
bucket made, then its keys written and read; a stream, then its messages and consumers).

The spec states every rule the gateway checks: JSON Schema where it can (patterns, lengths,
enums, bounds), and ``x-jsgw-rules`` (app/schemas.py) for what JSON Schema cannot say of query
parameters and headers, which one may come with which. :func:`broken_rules` reads those rules,
as a client would: a generated request that keeps them must be accepted, one that breaks one
must be refused with a 4xx."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from schemathesis import checks
from schemathesis.config import SchemathesisConfig

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
# SSE feeds never end by themselves, so each fuzzed call would wait for its timeout: they are
# left to their own tests (tests/integration/test_kv_watch.py, test_consumers_consume.py,
# test_obj_watch.py, test_core_nats_subscribe.py).
SSE_PATHS = (
    "/v1/kv/{bucket}/watch",
    "/v1/streams/{stream}/consumers/{consumer}/consume",
    "/v1/obj/{bucket}/watch",
    "/v1/nats/subscribe/{subject}",
)

# Statuses a valid request may get besides 2xx/3xx/401/403/404/409/429/5xx (schemathesis's
# defaults): the answers that depend on what is stored, not on the request's form.
#   412  a precondition (If-Match, Nats-Expected-*) that the stored data does not meet
#   413  a message over the NATS server's max_payload (a server setting, not in the spec)
#   501  a feature the connected nats-server release lacks (nats.feature_unsupported)
CONFIG = SchemathesisConfig.from_str(
    """
[checks]
positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "412",
    "413", "429", "5xx"]

# An ack token is signed by the gateway that handed it out: a schema can state its form, not
# its signature, so one made up by the fuzzer is refused with 400 ack.token_invalid (the whole
# batch, before any ack is sent). The stateful phase acks real ones (links from fetch/next).
[[operations]]
include-path = "/v1/streams/{stream}/consumers/{consumer}/ack"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409"]

# A pause ends in the future: a schema can state a time's form, not that it is still to come
# when the request arrives, nor that a Go duration is above zero; such a pause is refused with
# 400 consumer.pause_invalid (before anything is sent).
[[operations]]
include-path = "/v1/streams/{stream}/consumers/{consumer}/pause"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409"]

# A push subscription's endpoint must be under JSGW_PUSH_ALLOWED_URLS, a setting of the
# gateway and not of the spec (a "uri" of the schema's form is refused with 400
# subscription.endpoint_not_allowed unless it is under it), and its pause ends in the future
# as a consumer's does.
[[operations]]
include-path = "/v1/subscriptions/{name}"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409"]

[[operations]]
include-path = "/v1/subscriptions/{name}/pause"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409"]

# A core NATS request answers 503 nats.no_responders when nobody subscribes to the subject,
# and 504 nats.timeout when nobody answered in time: the contract's answers for a request
# of any valid form, which the spec declares.
[[operations]]
include-path = "/v1/nats/request/{subject}"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503", "504"]
"""
)

# -- formats the spec names -----------------------------------------------------------------

MAX_DURATION_NS = 2**63 - 1
_GO = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_UNIT_NS |= {"m": 60 * 10**9, "h": 3600 * 10**9}


def duration_seconds(value: Any) -> Decimal | None:
    """A duration as the spec's ``go-duration`` format and number form define it, in seconds
    (None: not one). Written from the definition, not taken from the gateway."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = Decimal(str(value))
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = Decimal(value)
    elif isinstance(value, str) and value == "0":
        seconds = Decimal(0)
    elif isinstance(value, str) and value and re.fullmatch(f"(?:{_GO.pattern})+", value):
        ns = sum(Decimal(n) * _UNIT_NS[u] for n, u in _GO.findall(value))
        seconds = ns / 10**9
    else:
        return None
    return seconds if 0 <= seconds * 10**9 <= MAX_DURATION_NS else None


_DURATION_TEXT = st.one_of(
    st.integers(0, 3600).map(lambda n: f"{n}s"),
    st.integers(0, 10**6).map(lambda n: f"{n}ms"),
    st.tuples(st.integers(0, 48), st.integers(0, 59)).map(lambda t: f"{t[0]}h{t[1]}m"),
    st.sampled_from(["0", "1.5s", "2562047h47m16.854775807s", "9223372036854775807ns"]),
)
_TIME = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
).map(lambda t: t.isoformat().replace("+00:00", "Z"))
FORMATS = {
    "go-duration": _DURATION_TEXT,
    "nats-ttl": st.one_of(st.just("never"), st.integers(1, 10**6).map(lambda n: f"{n}s")),
    # Times in the range the spec states (formatMinimum/formatMaximum): years 1 to 9999 in
    # UTC; tests/security/test_time_extremes.py sends the ones outside.
    "date-time": _TIME,
    # Message schedules (ADR-51), in each form nats-server takes.
    "nats-schedule": st.one_of(
        _TIME.filter(lambda t: "." not in t).map(lambda t: f"@at {t}"),
        st.integers(1, 10**6).map(lambda n: f"@every {n}s"),
        st.sampled_from(["@hourly", "@daily", "@yearly", "0 0 * * * *", "*/5 0-30 9 ? jan mon"]),
    ),
    "iana-time-zone": st.sampled_from(["UTC", "Europe/Amsterdam", "America/New_York"]),
}
for name, strategy in FORMATS.items():
    schemathesis.openapi.format(name, strategy)

schema = schemathesis.openapi.from_path(str(SPEC), config=CONFIG).exclude(path=list(SSE_PATHS))

# -- x-jsgw-rules -------------------------------------------------------------------------------


def _member(values: dict[str, Any], name: str) -> Any:
    value: Any = values
    for part in name.split("."):
        if not isinstance(value, dict):
            return None
        value = next((v for k, v in value.items() if k.lower() == part.lower()), None)
    return value


def _given(values: dict[str, Any], item: str) -> bool:
    """ "name" is given (present, not null, not empty), "name=a|b" has one of the values (a
    list: holds one), "name^=a|b" is a string starting with one, "name>0" is a number above
    0."""
    if "=" not in item and "|" in item:  # "a|b": one of these is given
        return any(_given(values, name) for name in item.split("|"))
    above = re.fullmatch(r"(.+)>(\d+)", item)
    if above:  # a number, or a duration in seconds, above N
        value = _member(values, above[1])
        if isinstance(value, bool) or value is None:
            return False
        number = value if isinstance(value, int | float) else duration_seconds(value)
        return number is not None and number > int(above[2])
    prefixed = re.fullmatch(r"(.+?)\^=(.+)", item)
    if prefixed:  # a string starting with one of these
        value = _member(values, prefixed[1])
        return isinstance(value, str) and value.startswith(tuple(prefixed[2].split("|")))
    name, _, wanted = item.partition("=")
    value = _member(values, name)
    if value is None or value == [] or value == "" or value == {}:
        return False
    if not wanted:
        return True
    options = wanted.lower().split("|")
    if isinstance(value, list):
        return any(str(v).lower() in options for v in value)
    return str(value).lower() in options


def collide(a: str, b: str) -> bool:
    """Whether two subject filters can match one subject (NATS's SubjectsCollide)."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False
        if ">" in (x[i], y[i]):
            return True
        if x[i] != y[i] and "*" not in (x[i], y[i]):
            return False
    return True


def within(a: str, b: str) -> bool:
    """Whether every subject filter ``a`` matches, ``b`` matches too."""
    x, y = a.split("."), b.split(".")
    for i, token in enumerate(y):
        if token == ">":
            return len(x) > i
        if i >= len(x) or (token != "*" and token != x[i]) or (token == "*" and x[i] == ">"):
            return False
    return len(x) == len(y)


def rule_holds(rule: dict[str, Any], values: dict[str, Any]) -> bool:
    if "exclusive" in rule:
        return sum(_given(values, name) for name in rule["exclusive"]) <= 1
    if "any_of" in rule:
        return any(_given(values, name) for name in rule["any_of"])
    if "distinct_names" in rule:
        names = [str(n).lower() for n in _member(values, rule["distinct_names"]) or {}]
        return len(names) == len(set(names))
    if "if" in rule:
        equals = rule.get("equals")
        condition = rule["if"]
        if equals is not None:
            condition += "=" + "|".join(map(str, equals if isinstance(equals, list) else [equals]))
        if not _given(values, condition):
            return True
        return all(_given(values, item) for item in rule.get("requires", ())) and not any(
            _given(values, item) for item in rule.get("forbids", ())
        )
    if "transform" in rule:
        source, destination = rule["transform"]
        if not _given(values, destination):
            return True
        src = str(_member(values, source) or rule["default"]).split(".")
        dest = str(_member(values, destination))
        tokens = dest.split(".")
        named = [
            int(n) for n in re.findall(r"\$(\d+)|\{\{wildcard\((\d+)\)\}\}", dest) for n in n if n
        ]
        return (
            "*" not in tokens
            and (src[-1] == ">") == (tokens[-1] == ">")
            and all(1 <= n <= src.count("*") for n in named)
        )
    if "disjoint" in rule:
        items = _member(values, rule["disjoint"]) or []
        if "member" in rule:
            items = [i.get(rule["member"]) for i in items if isinstance(i, dict)]
        items = [str(i) for i in items if i is not None]
        return not any(collide(a, b) for n, a in enumerate(items) for b in items[n + 1 :])
    if "colliding" in rule:
        subjects = [str(s) for s in _member(values, rule["colliding"]) or []]
        touching = any(
            collide(s, ns) and not any(within(s, ok) for ok in rule["unless"])
            for s in subjects
            for ns in rule["namespaces"]
        )
        return not touching or all(_given(values, item) for item in rule["requires"])
    if "apart" in rule:
        member = _member(values, rule["apart"])
        if member is None:
            return True
        subjects = _member(values, rule.get("subjects", ""))
        if not subjects:
            if any(_given(values, name) for name in rule["unless"]):
                return True
            subjects = [rule["otherwise"].format(**values)]
        return not any(collide(str(member), str(s)) for s in subjects)
    if "at_most" in rule:
        name, limit = rule["at_most"]
        value, ceiling = _member(values, name), _member(values, limit)
        ceiling = rule["default"] if ceiling is None else ceiling
        return value is None or int(value) <= int(ceiling)
    if "count" in rule:
        items, limit = _member(values, rule["count"]), _member(values, rule["not_above"])
        return not (isinstance(limit, int) and limit > 0 and len(items or []) > limit)
    if "differs" in rule:
        name, parameter = rule["differs"]
        return (
            not _given(values, name)
            or ("unless" in rule and _given(values, rule["unless"]))
            or _member(values, name) != _member(values, parameter)
        )
    if "atomic_batch" in rule:
        return not _given(values, rule["when"]) or atomic_batch_holds(
            _member(values, rule["atomic_batch"])
        )
    if "same" in rule:
        name, parameter = rule["same"]
        return not _given(values, name) or _member(values, name) == _member(values, parameter)
    if "duration" in rule:
        value = _member(values, rule["duration"])
        if value is None:
            return True
        seconds = duration_seconds(value)
        if seconds is None:
            return True  # not a duration: the format's business, not the rule's
        if seconds == 0 and rule.get("or_zero"):
            return True
        if "minimum" in rule and seconds < Decimal(str(rule["minimum"])):
            return False
        if "maximum" in rule and seconds > Decimal(str(rule["maximum"])):
            return False
        if "half_of" in rule:
            other = _member(values, rule["half_of"])
            if other is not None:
                limit = duration_seconds(other)
            elif "none_when" in rule and _given(values, rule["none_when"]):
                limit = Decimal(0)
            else:
                limit = None if "default" not in rule else Decimal(str(rule["default"]))
            if limit is not None and 2 * seconds > limit:
                return False
        ceiling = _member(values, rule.get("not_above", ""))
        if ceiling is not None:
            limit = duration_seconds(ceiling)
            if limit and seconds > limit:
                return False
        return True
    raise AssertionError(f"unknown rule {rule}")


def atomic_batch_holds(items: Any) -> bool:
    """The header rules of atomic batches (ADR-50), written from nats-server's checks."""
    ids: set[str] = set()
    written: set[str] = set()
    for index, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        raw = item.get("headers")
        headers = {str(k).lower(): v for k, v in raw.items()} if isinstance(raw, dict) else {}
        if "nats-expected-last-msg-id" in headers:
            return False
        if index and "nats-expected-last-sequence" in headers:
            return False
        msg_id = item.get("msg_id", headers.get("nats-msg-id"))
        if msg_id is not None:
            if msg_id in ids:
                return False
            ids.add(msg_id)
        subject = item.get("subject")
        if "nats-expected-last-subject-sequence" in headers and subject in written:
            return False
        written.add(subject)
    return True


def _resolved(node: Any, spec: dict[str, Any]) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = spec["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _broken_in_body(node: Any, value: Any, spec: dict[str, Any], context: dict[str, Any]) -> list:
    """The rules of the object schemas of a body that the part they describe breaks."""
    node = _resolved(node, spec)
    if not isinstance(node, dict):
        return []
    broken = []
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        broken += _broken_in_body(branch, value, spec, context)
    if value is None or isinstance(value, dict):  # (a body left out: its rules on the rest)
        given = {**context, **(value or {})}
        broken += [rule for rule in node.get("x-jsgw-rules", []) if not rule_holds(rule, given)]
    if isinstance(value, dict):
        for name, member in node.get("properties", {}).items():
            if name in value:
                broken += _broken_in_body(member, value[name], spec, context)
    if isinstance(value, list) and "items" in node:
        for item in value:
            broken += _broken_in_body(node["items"], item, spec, context)
    return broken


def broken_rules(case: schemathesis.Case) -> list[dict[str, Any]]:
    """The rules of ``x-jsgw-rules`` that a request breaks."""
    operation = case.operation.definition.raw
    values: dict[str, Any] = {}
    for part in (case.query, case.headers, case.path_parameters):
        values.update(part or {})
    broken = [rule for rule in operation.get("x-jsgw-rules", []) if not rule_holds(rule, values)]
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    body = case.body if isinstance(case.body, dict | list) else None  # no body: rules hold still
    if schema is not None:
        broken += _broken_in_body(schema, body, case.operation.schema.raw_schema, values)
    return broken


def repair(case: schemathesis.Case) -> None:
    """A generated body member that a ``same`` rule ties to a path parameter (a stream
    config's ``name``) is set to it, as a client sets it: otherwise nearly every generated
    config would break the rule and be checked for its refusal only."""
    meta = case.meta
    if not isinstance(case.body, dict) or meta is None or not meta.generation.mode.is_positive:
        return  # (a negative case stays as generated: what it breaks is what it tests)
    for rule in broken_rules(case):
        if "same" in rule:
            name, parameter = rule["same"]
            case.body[name] = (case.path_parameters or {}).get(parameter)


def check(case: schemathesis.Case, response: Any) -> None:
    """Every check, for a request within the rules; for one that breaks a rule, a 4xx and
    every check but the acceptance of valid data."""
    if out_of_rules(case):
        refused_as_broken(response, case)
        case.validate_response(response, excluded_checks=[checks.positive_data_acceptance])
    else:
        case.validate_response(response)


def refused_as_broken(response: Any, case: schemathesis.Case) -> None:
    """A request that breaks a rule the spec states is refused: a 4xx, never stored or served
    (a 404 or 409 about what does not exist may come first)."""
    assert 400 <= response.status_code < 500, (
        f"{case.operation.label} breaks {[r['description'] for r in broken_rules(case)]} but "
        f"got {response.status_code}:\n{case.as_curl_command()}\n{response.text[:500]}"
    )


def out_of_rules(case: schemathesis.Case) -> bool:
    """A request generated as valid that breaks a rule of the spec's ``x-jsgw-rules``:
    schemathesis reads JSON Schema only, and such a request is not valid."""
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive and bool(broken_rules(case))


# -- the runs -------------------------------------------------------------------------------

pytestmark = pytest.mark.slow


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_operations_conform(case: schemathesis.Case, gateway_url: str) -> None:
    repair(case)
    check(case, case.call(base_url=gateway_url, timeout=10))


# -- the stateful phase: sequences of calls that follow the spec's links ----------------------

_STATEFUL_URL: list[str] = []


@pytest.fixture(scope="module")
def stateful_gateway(gateway_url: str) -> Iterator[str]:
    """The gateway, with a bucket of keys, a stream of messages and a consumer to start from:
    the listings link to them (schemathesis starts a sequence from a listing or a POST)."""
    with httpx.Client(base_url=gateway_url, timeout=10) as http:
        http.put("/v1/kv/wf", json={"history": 5}).raise_for_status()
        for key in ("a", "b.c"):
            http.put(f"/v1/kv/wf/keys/{key}", content=b"1").raise_for_status()
        http.put("/v1/streams/WF", json={"subjects": ["wf.>"], "allow_direct": True})
        for n in range(5):
            http.post(f"/v1/publish/wf.{n}", content=b"m").raise_for_status()
        http.put("/v1/streams/WF/consumers/C", json={"ack_policy": "explicit"}).raise_for_status()
    _STATEFUL_URL.append(gateway_url)
    yield gateway_url
    _STATEFUL_URL.clear()


class Workflows(schema.as_state_machine()):  # type: ignore[misc]
    """A bucket made, then its keys written, read, deleted; a stream, then messages published
    into it, read back, consumers made, fetched from and acked (the links of the spec)."""

    checked: ClassVar[int] = 0
    failures: ClassVar[list[str]] = []

    def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
        return {"base_url": _STATEFUL_URL[0], "timeout": 10}

    def before_call(self, case: schemathesis.Case) -> None:
        repair(case)

    def validate_response(
        self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any
    ) -> None:
        try:
            check(case, response)
        except Exception as exc:
            Workflows.failures.append(f"{case.as_curl_command()}\n{exc}")
            raise
        Workflows.checked += 1


def test_stateful_workflows(stateful_gateway: str) -> None:
    """Sequences of calls that follow the links, with every check on every answer. A sequence
    is not replayed (the server's state moved on, so hypothesis would draw differently and
    call it flaky): each attempt runs fresh sequences until one of them fails a check."""
    for _ in range(5):
        # (Flaky: the run's sequences so far were checked, and their failures recorded.)
        with contextlib.suppress(Flaky):
            Workflows.run(
                settings=settings(
                    max_examples=60,
                    stateful_step_count=10,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                    phases=[Phase.generate],
                )
            )
        assert not Workflows.failures, Workflows.failures[0]
        if Workflows.checked >= 300:
            break
    assert Workflows.checked >= 300, f"only {Workflows.checked} answers checked"
