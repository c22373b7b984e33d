"""PySpark data source and jobs for JetStream streams and KV buckets, through the gateway.

``pipeline.register(spark)`` makes ``spark.read.format("jetstream")``,
``spark.readStream.format("jetstream")`` and ``df.write.format("jetstream")`` available.
Nothing here runs at import time, and nothing needs a NATS client: every call goes to the
gateway over HTTP.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

FORMAT = "jetstream"
LOGGER = "jsgw.pipeline"


def worker_logging() -> logging.Logger:
    """The pipeline's logger, printing INFO lines on stderr where nothing else is set up.

    Spark's Python workers configure no logging; their stderr ends up in the executor's log
    (the console, for a local session), which is where a task's progress belongs.
    """
    logger = logging.getLogger(LOGGER)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return logger


def register(spark: Any) -> None:
    """Register the ``jetstream`` format on a SparkSession.

    Spark starts the data source's Python workers with ``PYSPARK_PYTHON`` (or
    ``spark.pyspark.python``), else with ``python3`` from PATH, which for a program run as
    ``.venv/bin/python job.py`` without an activated virtualenv is another Python, without
    this package. Where neither is set, the data source is registered to run with the
    driver's own interpreter (``sys.executable``); the session's other Python functions are
    left as they are.
    """
    from pipeline.source import JetStreamDataSource

    context = _local_context(spark)
    if context is None or _python_chosen(context):
        spark.dataSource.register(JetStreamDataSource)
        return
    # pyspark hands the context's pythonExec to the JVM with the registered function.
    previous = context.pythonExec
    context.pythonExec = sys.executable
    try:
        spark.dataSource.register(JetStreamDataSource)
    finally:
        context.pythonExec = previous


def _local_context(spark: Any) -> Any:
    """The session's SparkContext; None for a Spark Connect session (it has none)."""
    from pyspark.errors import PySparkException

    try:
        return spark.sparkContext
    except PySparkException:  # not implemented on Connect sessions
        return None


def _python_chosen(context: Any) -> bool:
    return bool(os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python"))
