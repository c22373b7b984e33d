"""Push subscriptions: the gateway pulls from a durable consumer and POSTs to the application."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query
from starlette.responses import Response

from app import errors
from app.auth import access
from app.auth.access import AUTHENTICATED, SUBSCRIPTION, Need
from app.auth.policy import Principal, Resource
from app.deps import PrincipalDep, PushDep, SubscriptionName
from app.http import JSON, problems
from app.push.schemas import PauseSubscription, Subscription, SubscriptionInfo, SubscriptionList
from app.push.service import FilterCheck, PushService
from app.routing import Router

router = Router(prefix="/v1/subscriptions", tags=["subscriptions"])

_ADMIN = Need("admin", SUBSCRIPTION, narrowed=True)


@router.get(
    "",
    access=AUTHENTICATED,
    response_model=SubscriptionList,
    response_class=JSON,
    responses=problems(),
)
async def list_subscriptions(push: PushDep, principal: PrincipalDep) -> Any:
    """List the push subscriptions with their state: with auth on, those whose consumer the
    token may consume or administer."""
    if principal.anonymous:
        return JSON(await push.list())
    return JSON(
        await push.list(
            visible=lambda config: access.sees_consumer(principal, config.stream, config.consumer)
        )
    )


@router.put(
    "/{name}",
    access=_ADMIN,
    response_model=SubscriptionInfo,
    response_class=JSON,
    status_code=200,
    responses={
        201: {"description": "Created", "model": SubscriptionInfo},
        **problems(errors.Forbidden, errors.NotFound, errors.Conflict),
    },
)
async def put_subscription(
    name: SubscriptionName, config: Subscription, push: PushDep, principal: PrincipalDep
) -> Any:
    """Create (201) or update (200) a push subscription: every gateway process delivers it.

    The consumer is made from `consumer_config` when it does not exist. The endpoint must be
    under JSGW_PUSH_ALLOWED_URLS (400 subscription.endpoint_not_allowed); `admin` on the
    consumer is needed (and on the one a subscription being changed delivers now).
    """
    existing = await push.find(name)
    if existing is not None:
        _require_admin(principal, existing)
    _require_admin(principal, config)
    info, created = await push.put(name, config, _filter_check(principal, config))
    return JSON(info, status_code=201 if created else 200)


@router.get(
    "/{name}",
    access=AUTHENTICATED,
    response_model=SubscriptionInfo,
    response_class=JSON,
    responses=problems(errors.Forbidden, errors.NotFound),
)
async def get_subscription(name: SubscriptionName, push: PushDep, principal: PrincipalDep) -> Any:
    """A subscription's config and state (the counters are of the gateway process that
    answers; the consumer's figures are the server's)."""
    if not principal.anonymous:
        config = await push.subscription(name)
        access.require_sees_consumer(principal, config.stream, config.consumer)
    return JSON(await push.info(name))


@router.delete(
    "/{name}",
    access=_ADMIN,
    status_code=204,
    responses=problems(errors.Forbidden, errors.NotFound, errors.Conflict),
)
async def delete_subscription(
    name: SubscriptionName,
    push: PushDep,
    principal: PrincipalDep,
    delete_consumer: Annotated[
        bool, Query(description="also delete the consumer (it stays by default)")
    ] = False,
) -> Response:
    """Stop delivering (every process); the consumer stays unless `delete_consumer=true`."""
    await _admin_of(push, principal, name)
    await push.delete(name, delete_consumer=delete_consumer)
    return Response(status_code=204)


@router.post(
    "/{name}/pause",
    access=_ADMIN,
    response_model=SubscriptionInfo,
    response_class=JSON,
    responses=problems(errors.Forbidden, errors.NotFound, errors.Unsupported),
)
async def pause_subscription(
    name: SubscriptionName,
    push: PushDep,
    principal: PrincipalDep,
    request: PauseSubscription | None = None,
) -> Any:
    """Pause delivery (the consumer's pause: every process stops pulling; messages out are
    finished and acked), until a time, for a duration, or until resumed."""
    await _admin_of(push, principal, name)
    return JSON(await push.pause(name, request.until if request is not None else None))


@router.post(
    "/{name}/resume",
    access=_ADMIN,
    response_model=SubscriptionInfo,
    response_class=JSON,
    responses=problems(errors.Forbidden, errors.NotFound, errors.Unsupported),
)
async def resume_subscription(
    name: SubscriptionName, push: PushDep, principal: PrincipalDep
) -> Any:
    """Resume a paused subscription's delivery now."""
    await _admin_of(push, principal, name)
    return JSON(await push.resume(name))


def _require_admin(principal: Principal, config: Subscription) -> None:
    access.require(principal, "admin", Resource("consumer", f"{config.stream}/{config.consumer}"))


async def _admin_of(push: PushService, principal: Principal, name: str) -> None:
    """403 unless the token may administer the consumer the subscription delivers (404 when
    there is no such subscription)."""
    if not principal.anonymous:
        _require_admin(principal, await push.subscription(name))


def _filter_check(principal: Principal, config: Subscription) -> FilterCheck | None:
    """403 when the consumer delivers subjects a deny of the token's stream rules takes from
    it (as for consuming it)."""
    if principal.anonymous or not access.concerns_stream(principal, config.stream):
        return None

    def check(filters: list[str]) -> None:
        access.check_consumer(principal, config.stream, config.consumer, filters)

    return check
