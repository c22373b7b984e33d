"""PySpark data source and jobs for JetStream streams and KV buckets, through the gateway.

``pipeline.register(spark)`` makes ``spark.read.format("jetstream")``,
``spark.readStream.format("jetstream")`` and ``df.write.format("jetstream")`` available.
Nothing here runs at import time, and nothing needs a NATS client: every call goes to the
gateway over HTTP.
"""

from __future__ import annotations

import logging
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
    """Register the ``jetstream`` format on a SparkSession."""
    from pipeline.source import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)
