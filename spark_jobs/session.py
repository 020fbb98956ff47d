"""Spark's practicalities on a plain machine, in one place.

A fresh machine has Java 17 on the PATH but no `JAVA_HOME`; PySpark's launcher needs it.
Executors must run the same interpreter as the driver (the one with keyshard installed), and
on hosts whose name does not resolve to a reachable address Spark binds to nothing useful,
so the driver is pinned to loopback. Everything is `setdefault`: a real cluster's settings win.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkEnvironmentError(RuntimeError):
    """Spark cannot start here; the message says what is missing."""


def java_home_from_path() -> str:
    """`JAVA_HOME` derived from the `java` on the PATH (`readlink -f $(command -v java)`/../..)."""
    java = shutil.which("java")
    if java is None:
        raise SparkEnvironmentError(
            "Spark needs Java 17: no `java` on the PATH and JAVA_HOME is not set"
        )
    return str(Path(os.path.realpath(java)).parent.parent)


def configure_spark_environment() -> None:
    """Set JAVA_HOME, PYSPARK_PYTHON/PYSPARK_DRIVER_PYTHON and SPARK_LOCAL_IP unless already set."""
    if not os.environ.get("JAVA_HOME"):
        os.environ["JAVA_HOME"] = java_home_from_path()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_session(app_name: str, threads: int = 2, **conf: str) -> SparkSession:
    """A local[threads] session with the UI off and small shuffles (tests, demos, benchmarks).

    Long-lived consumer tasks each hold a task slot, so a job of N executor consumers needs
    `threads >= N` (threads are task slots here, not cores).
    """
    configure_spark_environment()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{threads}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(max(2, threads)))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
