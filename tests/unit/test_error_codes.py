"""The code registry: every code is an ErrorCode member, raised by its one class, caught by type.

A code is never written as a string outside app/errors.py, and never compared: a typo would
change behaviour silently, where a misspelt member or class fails at import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app import errors
from app.errors import ErrorCode, WarningCode

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    path
    for folder in ("app", "routers")
    for path in (ROOT / folder).rglob("*.py")
    if path != ROOT / "app" / "errors.py"
)
CODE_VALUES = {code.value for code in ErrorCode} | {code.value for code in WarningCode}


def _trees() -> list[tuple[str, ast.AST]]:
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text())) for path in SOURCES]


def test_no_code_is_written_as_a_string() -> None:
    found = [
        f"{name}:{node.lineno}: {node.value!r}"
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in CODE_VALUES
    ]
    assert not found, "use the ErrorCode member:\n" + "\n".join(found)


ERROR_CLASSES = {
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.GatewayError)
}


def _error_class_calls() -> list[tuple[str, ast.Call, str]]:
    """Every call of an error class in the sources: (file, call, the class's name)."""
    calls = []
    for name, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ERROR_CLASSES:
                calls.append((name, node, called))
    return calls


def test_no_error_class_is_given_a_string_literal_code() -> None:
    found = []
    for name, node, _ in _error_class_calls():
        given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]
        if any(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in given):
            found.append(f"{name}:{node.lineno}")
    assert not found, "an error's code is an ErrorCode member:\n" + "\n".join(found)


def test_every_literal_pairing_of_class_and_code_is_the_registered_one() -> None:
    # ``errors.NotFound(ErrorCode.STREAM_NOT_FOUND, ...)`` would fail when raised (it must be a
    # StreamNotFound, or ``except errors.StreamNotFound`` would miss it): found here instead.
    found = []
    for name, node, called in _error_class_calls():
        first = node.args[0] if node.args else None
        if not (
            isinstance(first, ast.Attribute)
            and isinstance(first.value, ast.Name)
            and first.value.id == "ErrorCode"
        ):
            continue
        expected = ErrorCode[first.attr].error_class.__name__
        if called != expected:
            found.append(f"{name}:{node.lineno}: {first.attr} is raised as {expected}")
    assert not found, "\n".join(found)


def _names_a_code(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "ErrorCode"
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_code(element) for element in node.elts)
    return False


def test_no_code_is_compared() -> None:
    # Catch the class instead (``except errors.StreamNotFound``). Numeric codes (the status
    # of a pull reply) are not error codes.
    found = []
    for name, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            reads_a_code = any(isinstance(s, ast.Attribute) and s.attr == "code" for s in sides)
            if reads_a_code and any(_names_a_code(side) for side in sides):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "catch the error's class instead:\n" + "\n".join(found)


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_every_code_has_a_class_a_status_and_a_meaning(code: ErrorCode) -> None:
    assert issubclass(code.error_class, code.status_class)
    assert issubclass(code.status_class, errors.GatewayError)
    assert 400 <= code.status < 600
    assert code.meaning.strip() and code.meaning.endswith("."), code
    assert "\n" not in code.meaning


def test_values_are_unique_and_well_formed() -> None:
    # Two members with one value would make the second an alias of the first.
    assert len(ErrorCode.__members__) == len(ErrorCode)
    for code in ErrorCode:
        assert code.name == code.value.upper().replace(".", "_"), code
        assert all(part.replace("_", "").isalpha() for part in code.value.split(".")), code


def test_every_jetstream_err_code_maps_to_a_registered_code() -> None:
    for err_code, code in errors._JS_ERRORS.items():
        assert isinstance(code, ErrorCode), err_code
        error = errors.from_jetstream({"code": 500, "err_code": err_code, "description": "x"})
        assert error.code is code
        assert type(error) is code.error_class
        assert err_code in errors.jetstream_err_codes(code)


def test_the_codes_that_are_caught_have_their_own_class() -> None:
    own = {
        errors.StreamNotFound: ErrorCode.STREAM_NOT_FOUND,
        errors.StreamDeleted: ErrorCode.STREAM_DELETED,
        errors.StreamNoMatch: ErrorCode.STREAM_NO_MATCH,
        errors.StreamExists: ErrorCode.STREAM_EXISTS,
        errors.ConsumerNotFound: ErrorCode.CONSUMER_NOT_FOUND,
        errors.ConsumerExists: ErrorCode.CONSUMER_EXISTS,
        errors.MessageNotFound: ErrorCode.MESSAGE_NOT_FOUND,
        errors.DirectNotAllowed: ErrorCode.DIRECT_NOT_ALLOWED,
        errors.TtlDisabled: ErrorCode.PUBLISH_TTL_DISABLED,
        errors.OutcomeUnknown: ErrorCode.NATS_OUTCOME_UNKNOWN,
    }
    for cls, code in own.items():
        assert code.error_class is cls
        error = cls(detail="d")
        assert error.code is code and error.status == code.status
        assert isinstance(error, code.status_class)


def test_a_code_is_raised_only_by_its_class() -> None:
    with pytest.raises(TypeError, match="ErrorCode member"):
        errors.NotFound("stream.not_found", "a string is not a code")
    with pytest.raises(TypeError, match="raised as StreamNotFound"):
        errors.NotFound(ErrorCode.STREAM_NOT_FOUND, "the generic class would dodge the catch")
    with pytest.raises(TypeError, match="raised as InvalidInput"):
        errors.Conflict(ErrorCode.REQUEST_INVALID, "a 400 code on a 409")
    with pytest.raises(TypeError, match="needs an ErrorCode"):
        errors.NotFound(detail="no code")
    with pytest.raises(TypeError, match="raised as MessageNotFound"):
        errors.StreamNotFound(ErrorCode.MESSAGE_NOT_FOUND)


def test_a_class_carries_only_codes_of_its_status() -> None:
    with pytest.raises(TypeError, match="a NotFound"):

        class Wrong(errors.Conflict):
            own_code = ErrorCode.KV_KEY_NOT_FOUND


def test_for_code_builds_the_class_of_the_code() -> None:
    error = errors.for_code(ErrorCode.DIRECT_NOT_ALLOWED, "d")
    assert isinstance(error, errors.DirectNotAllowed)
    assert errors.for_code(ErrorCode.REQUEST_INVALID).status == 400


def test_the_pipeline_reads_the_same_codes() -> None:
    gateway = pytest.importorskip("pipeline.gateway")

    assert ErrorCode.MESSAGE_NOT_FOUND.value == gateway.MESSAGE_NOT_FOUND
