"""Subscriptions declared in a file (``JSGW_SUBSCRIPTIONS``): applied by every gateway process
at start, never stored, and not changed through the API.

The file is YAML or JSON (by its ``.json`` suffix): a mapping of names to subscriptions, or a
list of subscriptions each with its ``name``::

    orders:
      stream: ORDERS
      consumer: orders-push
      endpoint: http://127.0.0.1:3000/orders
      consumer_config: {filter_subject: "orders.>", ack_wait: 30s, max_deliver: 5}
      dead_letter: {subject: dlq.orders}

Each is checked as a ``PUT /v1/subscriptions/{name}`` body is, its endpoint against
``JSGW_PUSH_ALLOWED_URLS`` too; a bad file stops the gateway at start-up, naming the entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app import errors, validation
from app.push.allowlist import Allowlist
from app.push.schemas import Subscription


class SubscriptionsFileError(ValueError):
    pass


def load(path: Path, allowlist: Allowlist) -> dict[str, Subscription]:
    """The subscriptions of the file, by name; SubscriptionsFileError saying what is wrong."""
    try:
        text = path.read_text()
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SubscriptionsFileError(f"{path}: {exc}") from None
    if data is None:
        return {}
    return {name: _checked(path, name, body, allowlist) for name, body in _entries(path, data)}


def _entries(path: Path, data: Any) -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return list(data.items())
    if not isinstance(data, list):
        raise SubscriptionsFileError(
            f"{path}: expected a mapping of names to subscriptions, or a list"
        )
    entries: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for index, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise SubscriptionsFileError(f"{path}: entry {index} has no name")
        name = item["name"]
        if name in seen:
            raise SubscriptionsFileError(f"{path}: {name!r} is declared twice")
        seen.add(name)
        entries.append((name, {k: v for k, v in item.items() if k != "name"}))
    return entries


def _checked(path: Path, name: Any, body: Any, allowlist: Allowlist) -> Subscription:
    where = f"{path}: subscription {name!r}"
    if not isinstance(name, str):
        raise SubscriptionsFileError(f"{where}: a name is a string")
    try:
        validation.consumer_name(name)
        config = Subscription.model_validate(body)
        allowlist.check(config.endpoint)
    except errors.GatewayError as exc:
        raise SubscriptionsFileError(f"{where}: {exc.detail}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise SubscriptionsFileError(f"{where}: {problems}") from None
    return config
