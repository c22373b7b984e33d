"""A local Spark session and a real gateway (uvicorn on loopback) over the session's nats-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.nats.embedded import EmbeddedServer
from tests.helpers import gateway_settings, served_gateway


def _java_problem() -> str | None:
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if os.environ.get("JAVA_HOME")
        else None
    )
    if java is None or not os.path.exists(java):
        return "Spark needs a Java runtime (17 or later): none found on PATH or in JAVA_HOME"
    result = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        return (
            f"Spark needs a working Java runtime: `java -version` failed: {result.stderr.strip()}"
        )
    return None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One SparkSession for all Spark tests.

    ``local[2,2]``: two cores, and a failed task is tried once more (as on a cluster), which
    the idempotent-write test relies on.
    """
    problem = _java_problem()
    if problem:
        pytest.skip(problem)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import pipeline

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    # As a program run with a virtualenv's python that is not activated: no PYSPARK_PYTHON,
    # and a python3 on PATH that is not this one (here one that fails at once). The data
    # source's workers run all the same: pipeline.register gives them the driver's Python.
    os.environ.pop("PYSPARK_PYTHON", None)
    os.environ.pop("PYSPARK_DRIVER_PYTHON", None)
    other = tmp_path_factory.mktemp("other-python")
    (other / "python3").write_text("#!/bin/sh\necho 'not the python of the tests' >&2\nexit 97\n")
    (other / "python3").chmod(0o755)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{other}{os.pathsep}{path}"
    builder = (
        SparkSession.builder.master("local[2,2]")
        .appName("jsgw-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
    )
    try:
        session = builder.getOrCreate()
    finally:
        os.environ["PATH"] = path  # the JVM keeps the one it started with
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    # The tests' own Python functions (UDFs) are not the data source's: they run here too.
    session.sparkContext.pythonExec = sys.executable
    yield session
    session.stop()


@pytest.fixture(scope="session")
def gateway_url(nats_server: EmbeddedServer) -> Iterator[str]:
    """The real gateway app served by uvicorn on a free loopback port."""
    with served_gateway(gateway_settings(nats_server.url, request_timeout=5.0)) as url:
        yield url


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"
