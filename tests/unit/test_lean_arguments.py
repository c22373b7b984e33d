"""The lean paths call a route's endpoint with what FastAPI would pass its plain form, derived
from the route's own declaration; what they cannot pass alike stops start-up."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.responses import Response

from app import deps, fastpath
from app.auth.access import Need
from app.auth.policy import ANONYMOUS
from app.config import Settings
from app.deps import KVDep, PoolDep, PrincipalDep
from app.fastpath import LeanPathError
from app.main import create_app
from app.routing import Router

NEED = Need("read")


def _install(register: Any) -> fastpath.LeanPaths:
    router = Router()
    register(router)
    app = FastAPI()
    app.include_router(router)
    return fastpath.install(app)


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": headers or [],
        "state": {"runtime": object()},
    }


async def test_every_runtime_provider_hands_out_what_the_lean_paths_take() -> None:
    runtime = SimpleNamespace(**{a: object() for a in deps.FROM_RUNTIME.values() if a})
    request = SimpleNamespace(state=SimpleNamespace(runtime=runtime))
    for provider, attribute in deps.FROM_RUNTIME.items():
        arg = request if provider is deps.get_runtime else runtime
        expected = runtime if attribute is None else getattr(runtime, attribute)
        assert await provider(arg) is expected, provider


def test_the_app_s_lean_paths_match_hostile_keys_and_subjects_as_the_routes_do() -> None:
    app = create_app(Settings(nats_url=["nats://127.0.0.1:4222"]))
    lean = app.lean_paths
    assert lean is not None
    for method, path, params in [
        ("GET", "/v1/kv/b/keys/a\r\nX-Injected: 1", {"bucket": "b", "key": "a\r\nX-Injected: 1"}),
        ("PUT", "/v1/kv/b/keys/a\n", {"bucket": "b", "key": "a\n"}),
        ("HEAD", "/v1/kv/b/keys/a\r\n", {"bucket": "b", "key": "a\r\n"}),
        ("DELETE", "/v1/kv/b/keys/a\n", {"bucket": "b", "key": "a\n"}),
        ("GET", "/v1/kv/b\n/keys/a/b", {"bucket": "b\n", "key": "a/b"}),
        ("POST", "/v1/publish/x\n", {"subject": "x\n"}),
        ("POST", "/v1/publish/\r\nPUB x 1", {"subject": "\r\nPUB x 1"}),
    ]:
        scope = _scope(method, path)
        assert lean.take(scope), path
        assert scope["jsgw.lean"][1] == params
    for method, path in [
        ("GET", "/v1/kv/b/keys/"),
        ("DELETE", "/v1/kv/b"),
        ("POST", "/v1/publish"),
        ("GET", "/v1/kv/b/history/a"),
    ]:
        assert not lean.take(_scope(method, path)), path
    with_query = {**_scope("GET", "/v1/kv/b/keys/a"), "query_string": b"revision=1"}
    assert lean.take(with_query)
    assert with_query["jsgw.lean"][1] == {"bucket": "b", "key": "a"}


def test_an_optional_header_added_to_a_lean_route_reaches_it() -> None:
    def register(router: Router) -> None:
        @router.get("/{bucket}/k/{key:text}", access=NEED, lean=True)
        async def endpoint(
            bucket: str,
            key: str,
            request: Request,
            kv: KVDep,
            pool: PoolDep,
            principal: PrincipalDep,
            x_new: Annotated[str | None, Header()] = None,
            mode: Annotated[str, Query()] = "plain",
        ) -> Response:
            return Response()

    lean = _install(register)
    path = lean.by_method["GET"][0]
    runtime = SimpleNamespace(kv="KV", pool="POOL")
    scope = _scope("GET", "/b/k/a", [(b"x-new", b"first"), (b"x-new", b"second")])
    request = Request(scope)
    kwargs = path.arguments.build(request, {"bucket": "b", "key": "a"}, runtime, ANONYMOUS)
    assert kwargs == {
        "bucket": "b",
        "key": "a",
        "request": request,
        "kv": "KV",
        "pool": "POOL",
        "principal": ANONYMOUS,
        "x_new": "first",
        "mode": "plain",
    }
    absent = path.arguments.build(
        Request(_scope("GET", "/b/k/a")), {"bucket": "b", "key": "a"}, runtime, ANONYMOUS
    )
    assert absent["x_new"] is None


def test_a_query_is_validated_by_the_route_s_own_fields() -> None:
    def register(router: Router) -> None:
        @router.get("/{bucket}/watch", access=NEED, lean=True)
        async def endpoint(
            bucket: str,
            flag: Annotated[bool, Query()] = False,
            since: Annotated[int | None, Query(ge=0, le=10)] = None,
            key: Annotated[str | None, Query()] = None,
        ) -> Response:
            return Response()

    arguments = _install(register).by_method["GET"][0].arguments

    def build(query: bytes) -> dict[str, Any]:
        request = Request({**_scope("GET", "/b/watch"), "query_string": query})
        return arguments.build(request, {"bucket": "b"}, object(), ANONYMOUS)

    assert build(b"") == {"bucket": "b", "flag": False, "since": None, "key": None}
    assert build(b"flag=on&since=3&key=a.%3E&other=x") == {
        "bucket": "b",
        "flag": True,
        "since": 3,
        "key": "a.>",
    }
    assert build(b"since=7&since=2")["since"] == 2  # the last, as FastAPI reads it
    with pytest.raises(RequestValidationError) as refused:
        build(b"flag=maybe&since=11")
    assert [(e["loc"], e["type"]) for e in refused.value.errors()] == [
        (("query", "flag"), "bool_parsing"),
        (("query", "since"), "less_than_equal"),
    ]


def test_the_query_validation_the_lean_paths_borrow_is_fastapi_s_own() -> None:
    # app.fastpath validates queries with the function FastAPI's dependency solving uses: an
    # upgrade that moves or renames it must be a decision, not a surprise.
    from fastapi.dependencies import utils

    assert fastpath.request_params_to_args is utils.request_params_to_args
    assert "request_params_to_args(" in inspect.getsource(utils.solve_dependencies)


class Body(BaseModel):
    a: int


async def _other() -> int:
    return 1


@pytest.mark.parametrize(
    "case",
    [
        "required-query",
        "body",
        "dependency",
        "constrained-header",
        "constrained-path",
        "not-a-response",
        "sync",
    ],
)
def test_start_up_fails_when_the_lean_path_cannot_pass_what_fastapi_would(case: str) -> None:
    def register(router: Router) -> None:
        route = router.post("/{key}", access=NEED, lean=True)
        if case == "required-query":

            @route
            async def e1(key: str, q: Annotated[str, Query()]) -> Response: ...
        elif case == "body":

            @route
            async def e2(key: str, body: Body) -> Response: ...
        elif case == "dependency":

            @route
            async def e3(key: str, other: Annotated[int, Depends(_other)]) -> Response: ...
        elif case == "constrained-header":

            @route
            async def e4(
                key: str, h: Annotated[str | None, Header(max_length=3)] = None
            ) -> Response: ...
        elif case == "constrained-path":

            @route
            async def e5(key: int) -> Response: ...
        elif case == "not-a-response":

            @route
            async def e6(key: str) -> dict[str, str]: ...
        else:

            @route
            def e7(key: str) -> Response: ...

    with pytest.raises(LeanPathError):
        _install(register)
