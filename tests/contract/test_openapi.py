"""The committed spec is what the app serves.

Regenerate it with `jsgw openapi -o openapi/openapi.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.errors import ErrorCode
from app.main import openapi_document

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_committed_spec_matches_the_app() -> None:
    committed = json.loads(SPEC.read_text())
    assert committed == json.loads(json.dumps(openapi_document())), (
        "openapi/openapi.json is out of date: run `jsgw openapi -o openapi/openapi.json`"
    )


def test_operation_ids_are_unique() -> None:
    """Generated clients name a function after each operationId (app.routing.operation_id)."""
    spec = openapi_document()
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_every_operation_documents_problem_responses() -> None:
    spec = openapi_document()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if path in ("/healthz", "/metrics"):
                continue
            assert "400" in operation["responses"] or "503" in operation["responses"], (
                method,
                path,
            )
            assert operation.get("summary"), (method, path)


def test_problem_code_lists_every_registered_code() -> None:
    code = openapi_document()["components"]["schemas"]["Problem"]["properties"]["code"]
    assert code["enum"] == sorted(member.value for member in ErrorCode)
