from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from keyshard.spark_jobs.session import (
    SparkEnvironmentError,
    configure_spark_environment,
    java_home_from_path,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_java_home_is_derived_from_the_java_on_the_path() -> None:
    home = Path(java_home_from_path())
    assert (home / "bin" / "java").exists()


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkEnvironmentError, match="no `java` on the PATH"):
        java_home_from_path()


def test_settings_already_present_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    monkeypatch.setenv("JAVA_HOME", "/opt/my-java")
    configure_spark_environment()
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"
    assert os.environ["JAVA_HOME"] == "/opt/my-java"


def test_the_shared_session_runs_python_on_executors(spark: SparkSession) -> None:
    squares = spark.sparkContext.parallelize(range(4), 2).map(lambda x: x * x).collect()
    assert squares == [0, 1, 4, 9]
