"""One local[2] Spark session for every Spark test (a JVM start costs ~7 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from keyshard.spark_jobs.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("keyshard-tests", threads=2)
    try:
        yield session
    finally:
        session.stop()
