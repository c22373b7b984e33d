"""``jsgw-pipeline``: export-stream, snapshot-kv and load-kv as Spark jobs.

Run it with ``spark-submit`` (``spark-submit --master ... $(which jsgw-pipeline) ...``) or
directly, which starts a local Spark session (``--master``, default ``local[*]``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

log = logging.getLogger("jsgw.pipeline")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("JSGW_URL", "http://127.0.0.1:8080"),
        help="the gateway's base URL (env JSGW_URL)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("JSGW_TOKEN"),
        help="bearer token for the gateway (env JSGW_TOKEN)",
    )
    parser.add_argument("--partitions", type=int, help="Spark partitions per batch")
    parser.add_argument("--master", help="Spark master when no session exists (default local[*])")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jsgw-pipeline", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export-stream", help="stream -> Parquet (or Delta)")
    _common(export)
    export.add_argument("--stream", required=True)
    export.add_argument("--output", required=True, help="output path (any Spark file system)")
    export.add_argument("--subject", help="only messages on this subject (filter)")
    export.add_argument("--start-seq", type=int)
    export.add_argument("--end-seq", type=int)
    export.add_argument("--start-time", help="RFC 3339, inclusive")
    export.add_argument("--end-time", help="RFC 3339, exclusive")
    export.add_argument("--format", choices=["parquet", "delta"], default="parquet")
    export.add_argument("--mode", choices=["overwrite", "append"], default="overwrite")
    export.add_argument("--batch-size", type=int, default=1_000_000, help="sequences per Spark job")

    snapshot = commands.add_parser("snapshot-kv", help="bucket -> Parquet at one revision")
    _common(snapshot)
    snapshot.add_argument("--bucket", required=True)
    snapshot.add_argument("--output", required=True)
    snapshot.add_argument("--keys", help="comma-separated key filters (* and > allowed)")
    snapshot.add_argument("--as-of-revision", type=int)
    snapshot.add_argument("--as-of-time", help="RFC 3339")
    snapshot.add_argument(
        "--batch-size", type=int, default=1_000_000, help="sequences per Spark job"
    )

    load = commands.add_parser("load-kv", help="CSV/Parquet -> bucket")
    _common(load)
    load.add_argument("--bucket", required=True)
    load.add_argument("--input", required=True)
    load.add_argument(
        "--input-format",
        choices=["csv", "parquet"],
        default=None,
        help="default: from the input's extension, else parquet",
    )
    load.add_argument("--key-column", default="key")
    load.add_argument("--value-column", default="value")
    load.add_argument(
        "--write-id", help="stable id: a re-run within the duplicate window stores nothing twice"
    )
    return parser


def run(args: argparse.Namespace, spark: Any) -> Any:
    from pipeline import jobs

    if args.command == "export-stream":
        return jobs.export_stream(
            spark,
            url=args.url,
            token=args.token,
            stream=args.stream,
            output=args.output,
            subject=args.subject,
            start_sequence=args.start_seq,
            end_sequence=args.end_seq,
            start_time=args.start_time,
            end_time=args.end_time,
            partitions=args.partitions,
            output_format=args.format,
            mode=args.mode,
            chunk=args.batch_size,
        )
    if args.command == "snapshot-kv":
        return jobs.snapshot_kv(
            spark,
            url=args.url,
            token=args.token,
            bucket=args.bucket,
            output=args.output,
            keys=args.keys,
            as_of_revision=args.as_of_revision,
            as_of_time=args.as_of_time,
            partitions=args.partitions,
            chunk=args.batch_size,
        )
    input_format = args.input_format or (
        "csv" if args.input.lower().endswith(".csv") else "parquet"
    )
    return jobs.load_kv(
        spark,
        url=args.url,
        token=args.token,
        bucket=args.bucket,
        input_path=args.input,
        input_format=input_format,
        key_column=args.key_column,
        value_column=args.value_column,
        write_id=args.write_id,
        partitions=args.partitions,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    from pyspark.sql import SparkSession

    from pipeline.gateway import GatewayError
    from pipeline.options import OptionError

    existing = SparkSession.getActiveSession()
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if (args.master or "").startswith("local") or (
        args.master is None and not launched_by_spark_submit
    ):
        # A local Spark's Python workers must run this interpreter (it has the pipeline);
        # on a cluster, PYSPARK_PYTHON is the cluster's to set.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(f"jsgw-pipeline {args.command}")
    if args.master:  # otherwise spark-submit's, or local[*]
        builder = builder.master(args.master)
    spark = existing or builder.getOrCreate()
    try:
        summary = run(args, spark)
    except (GatewayError, OptionError) as exc:
        print(f"jsgw-pipeline {args.command}: {exc}", file=sys.stderr)
        return 1
    finally:
        if existing is None:
            spark.stop()
    print(json.dumps(asdict(summary), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
