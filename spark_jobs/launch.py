"""The session of a job that runs under `spark-submit` or as `python -m keyshard.spark_jobs.X`.

Under spark-submit the master and every setting come from spark-submit (a cluster's
choices win); started with plain `python`, the job makes a local session itself with the
environment fixes of `spark_jobs.session`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from keyshard.spark_jobs.session import configure_spark_environment, local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands the Python driver its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def job_session(app_name: str, master: str | None, threads: int = 2) -> SparkSession:
    """`master` if given; else spark-submit's master; else local[threads]."""
    configure_spark_environment()
    if master is None and under_spark_submit():
        from pyspark.sql import SparkSession

        session = SparkSession.builder.appName(app_name).getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        return session
    if master is None:
        return local_session(app_name, threads)
    if master.startswith("local"):
        session = local_session(app_name, 1, **{"spark.master": master})
        return session
    from pyspark.sql import SparkSession

    session = SparkSession.builder.master(master).appName(app_name).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
