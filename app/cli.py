"""The ``jsgw`` command: ``jsgw serve`` runs the gateway, ``jsgw openapi`` prints the spec,
``jsgw docs`` writes the pages of the problem codes, ``jsgw auth check`` and ``jsgw auth
explain`` review an auth file."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

import orjson
from pydantic import ValidationError

from app import logs

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.auth.policy import Policy
    from app.config import Settings

log = logging.getLogger("jsgw.cli")
# prometheus_client's multiprocess directory (app/metrics.py). Not imported from there: the
# variable must be settled before prometheus_client is imported in this process.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def app_from_env() -> FastAPI:
    """uvicorn factory: each worker builds its own app (and so its own NATS pool), and tunes
    its own garbage collector once that app has started (workers are spawned processes)."""
    from app.config import Settings
    from app.main import create_app
    from app.serving import tune_gc_once_started

    return tune_gc_once_started(create_app(Settings()))


def _load_settings() -> Settings:
    from app.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        lines = [
            f"  JSGW_{'_'.join(map(str, e['loc'])).upper() or '?'}: {e['msg']}"
            for e in exc.errors()
        ]
        print("jsgw: invalid configuration:\n" + "\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


def _shared_metrics_dir(workers: int) -> str | None:
    """With several workers: a new, empty directory for their metrics (prometheus_client's
    multiprocess mode), named in PROMETHEUS_MULTIPROC_DIR for the workers, which are spawned
    and so import prometheus_client after it is set. With one, the variable is removed: the
    worker is this process and keeps its metrics in memory. Either way a value inherited from
    the environment is not used: the directory must hold this gateway's workers only."""
    if workers <= 1:
        return None
    import tempfile

    path = tempfile.mkdtemp(prefix="jsgw-metrics-")
    os.environ[MULTIPROC_DIR] = path
    return path


def serve(_: argparse.Namespace) -> int:
    # Before anything imports prometheus_client (see _shared_metrics_dir).
    os.environ.pop(MULTIPROC_DIR, None)
    os.environ.pop(MULTIPROC_DIR.lower(), None)  # (its old spelling, still read)
    import shutil

    import uvicorn

    from app import compat
    from app.nats.embedded import EmbeddedServer
    from app.serving import connection_cap, raise_descriptor_limit
    from app.serving import uvicorn_options as serving_options
    from app.tls import uvicorn_options

    settings = _load_settings()
    logs.setup(settings.log_level)
    try:
        # Before any port or nats-server is taken; each worker checks again as it starts.
        compat.check()
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    if not settings.listens_on_loopback and settings.auth_file is None:
        log.warning(
            "LISTENING ON %s WITHOUT AUTHENTICATION: anyone who reaches this port can read, "
            "write and delete JetStream data. Set JSGW_AUTH_FILE or JSGW_HOST=127.0.0.1.",
            settings.host,
        )
    shared_server: EmbeddedServer | None = None
    if settings.embedded and settings.workers > 1:
        # Workers are separate processes: they share one embedded server started here.
        shared_server = EmbeddedServer(settings.data_dir)
        os.environ["JSGW_NATS_URL"] = shared_server.start()
        log.info("embedded nats-server for %d workers at %s", settings.workers, shared_server.url)
    before, after = raise_descriptor_limit()
    if after != before:
        log.info("open-file limit raised from %d to %d", before, after)
    log.info(
        "at most %d connections per worker (JSGW_MAX_CONNECTIONS, below the open-file limit "
        "%d); request heads within %ss (JSGW_HEADER_TIMEOUT); keep-alive %ss",
        connection_cap(settings.max_connections),
        after,
        settings.header_timeout,
        settings.keep_alive_timeout,
    )
    options = {**serving_options(settings.keep_alive_timeout), **uvicorn_options(settings)}
    metrics_dir = _shared_metrics_dir(settings.workers)
    if metrics_dir is not None:
        log.info("metrics of the %d workers shared in %s", settings.workers, metrics_dir)
    try:
        uvicorn.run(
            "app.cli:app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            access_log=False,
            log_config=logs.config(settings.log_level),
            timeout_graceful_shutdown=10,
            **options,
        )
    finally:
        if shared_server is not None:
            shared_server.stop()
        if metrics_dir is not None:
            os.environ.pop(MULTIPROC_DIR, None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def openapi(args: argparse.Namespace) -> int:
    from app.main import openapi_document

    text = orjson.dumps(openapi_document(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    if args.output:
        with open(args.output, "wb") as out:
            out.write(text + b"\n")
    else:
        sys.stdout.write(text.decode() + "\n")
    return 0


def docs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app import problem_docs

    written = problem_docs.write(Path(args.output))
    print(f"{len(written)} pages in {args.output}")
    return 0


def _auth_policy(args: argparse.Namespace) -> tuple[Policy, str]:
    from pathlib import Path

    from app.auth.policy import PolicyError, load

    path = args.file or os.environ.get("JSGW_AUTH_FILE")
    if not path:
        raise SystemExit("jsgw auth: give --file or set JSGW_AUTH_FILE")
    try:
        return load(Path(path), warn=False), path
    except PolicyError as exc:
        raise SystemExit(f"jsgw auth: {exc}") from None


def auth_check(args: argparse.Namespace) -> int:
    """The rules of the auth file that can never take effect: 0 when there are none, 1 else."""
    from app.auth.review import ineffective_rules

    policy, path = _auth_policy(args)
    warnings = ineffective_rules(policy)
    for warning in warnings:
        print(f"{path}: {warning}")
    if not warnings:
        print(f"{path}: {len(policy.principals)} tokens, every rule can take effect")
    return 1 if warnings else 0


def auth_explain(args: argparse.Namespace) -> int:
    """Which rule decides ACTION on RESOURCE for the token named NAME, and why: 0 when
    allowed, 1 when denied, 2 for a question that cannot be answered."""
    from app.auth.policy import PolicyError
    from app.auth.review import explain, parse_resource

    policy, _ = _auth_policy(args)
    principals = [p for p in policy.principals if p.name == args.token]
    if not principals:
        known = ", ".join(sorted({p.name for p in policy.principals})) or "none"
        print(f"jsgw auth: no token named {args.token!r} (tokens: {known})", file=sys.stderr)
        return 2
    try:
        resource = parse_resource(args.resource)
        explanations = [explain(p, args.action, resource) for p in principals]
    except PolicyError as exc:
        print(f"jsgw auth: {exc}", file=sys.stderr)
        return 2
    if len(principals) > 1:
        print(f"{len(principals)} tokens are named {args.token!r}: each is explained")
    for explanation in explanations:
        print("\n".join(explanation.lines()))
    return 0 if all(e.allowed for e in explanations) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jsgw", description="HTTP/REST + SSE gateway for NATS JetStream"
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="run the gateway (configured by JSGW_* variables)").set_defaults(
        func=serve
    )
    spec = sub.add_parser("openapi", help="print the OpenAPI spec")
    spec.add_argument("-o", "--output", help="write to this file instead of stdout")
    spec.set_defaults(func=openapi)
    pages = sub.add_parser("docs", help="write the pages of the problem codes (docs/problems/)")
    pages.add_argument("-o", "--output", default="docs/problems", help="the directory to write")
    pages.set_defaults(func=docs)
    auth = sub.add_parser("auth", help="review an auth file (JSGW_AUTH_FILE or --file)")
    auth_sub = auth.add_subparsers(dest="auth_command", required=True)
    check = auth_sub.add_parser("check", help="list the rules that can never take effect")
    check.set_defaults(func=auth_check)
    why = auth_sub.add_parser(
        "explain",
        help="say which rule decides an action on a resource for a token, and why",
        description="Exit status: 0 allowed, 1 denied, 2 unknown token or bad resource/action.",
    )
    why.add_argument("--token", required=True, metavar="NAME", help="the token's name")
    why.add_argument(
        "resource", help="kv:<bucket>[/<key>], stream:<name>[/<subject>], consumer:<stream>/<name>"
    )
    why.add_argument("action", choices=["read", "write", "admin", "consume"])
    why.set_defaults(func=auth_explain)
    for command in (check, why):
        command.add_argument("--file", help="the auth file (default: $JSGW_AUTH_FILE)")
    args = parser.parse_args(argv)
    return int(getattr(args, "func", serve)(args))
