"""The sessionization job on a real broker: its Parquet equals the plain-Python reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.brokers import Broker
from keyshard.local.processes import free_port
from keyshard.spark_jobs import clickstream
from keyshard.spark_jobs.pipeline import run_pipeline
from keyshard.spark_jobs.sessionize import parse_click, reference_sessions
from tests.spark_jobs.test_sessionize import _as_rows, session_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
TOPIC = "clicks"
pytestmark = pytest.mark.brokers("tansu", "kafka")


@pytest.mark.integration
async def test_pipeline_output_equals_the_reference(
    spark: SparkSession, broker: Broker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    records = clickstream.events(users=40, count=3000, seed=11, bad=15)
    await clickstream.ensure_topic(bootstrap, TOPIC, partitions=2)
    await clickstream.produce(bootstrap, TOPIC, records)
    output, rejects = tmp_path / "sessions", tmp_path / "rejects"

    result = run_pipeline(
        spark, bootstrap_servers=bootstrap, topics=[TOPIC], output=str(output),
        rejects=str(rejects), ranges=4,
    )  # fmt: skip

    # A user's records share a partition, in production order, so the reference's stable
    # sort by ts on the records as produced breaks ties exactly as (partition, offset) does.
    clicks = [c for r in records if (c := parse_click(r.key, r.value, TOPIC))]
    expected = reference_sessions(clicks)
    assert result.read_partitions == 2 * 4  # partitions x slot ranges
    assert (result.records, result.rejected, result.clicks) == (3015, 15, 3000)
    assert result.sessions == len(expected) > 40
    assert session_rows(spark.read.parquet(str(output))) == _as_rows(expected)
    rejected = spark.read.parquet(str(rejects)).collect()
    bad_values = {r.value for r in records if parse_click(r.key, r.value) is None}
    assert len(rejected) == 15 and {(r.value or "").encode() for r in rejected} == bad_values

    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match="already exists"):
        run_pipeline(spark, bootstrap_servers=bootstrap, topics=[TOPIC], output=str(output))


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyshard.spark_jobs.pipeline", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_missing_arguments_are_named() -> None:
    result = _cli("--topic", "clicks")
    assert result.returncode == 2
    assert "--bootstrap-servers" in result.stderr and "--output" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--ranges", "0"), "--ranges 0 is outside 1..65536"),
        (("--gap-minutes", "0"), "--gap-minutes must be > 0"),
        (("--topic", "a,,b"), "has an empty topic name"),
    ],
)
def test_bad_arguments_are_refused(args: tuple[str, ...], message: str) -> None:
    result = _cli("--bootstrap-servers", "127.0.0.1:9", "--output", "/tmp/x", "--topic", "t", *args)
    assert result.returncode == 2 and message in result.stderr


def test_unreachable_broker_is_a_clear_error_before_spark_starts() -> None:
    port = free_port()
    result = _cli(
        "--bootstrap-servers", f"127.0.0.1:{port}", "--topic", "t", "--output", "/tmp/x"
    )  # fmt: skip
    assert result.returncode == 2
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in result.stderr


@pytest.mark.integration
def test_unknown_topic_is_a_clear_error(broker: Broker) -> None:
    result = _cli(
        "--bootstrap-servers", broker.bootstrap_servers, "--topic", "nope", "--output", "/tmp/x"
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown topic(s) ['nope']" in result.stderr


@pytest.mark.integration
def test_the_readme_steps_give_the_documented_figures(broker: Broker, tmp_path: Path) -> None:
    """README "Spark": the clickstream generator, then the pipeline, as a user runs them;
    the same figures on every broker (Apache Kafka answers a fresh client's metadata
    differently from Tansu: keyshard.core.kafka.metadata)."""
    bootstrap = broker.bootstrap_servers
    generate = subprocess.run(
        [
            sys.executable, "-m", "keyshard.spark_jobs.clickstream",
            "--bootstrap-servers", bootstrap,
            "--topic", "clicks", "--users", "200", "--events", "20000", "--seed", "7",
            "--bad", "10", "--partitions", "2",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert generate.returncode == 0, generate.stderr
    result = _cli(
        "--bootstrap-servers", bootstrap, "--topic", "clicks", "--ranges", "8",
        "--output", str(tmp_path / "sessions"), "--rejects", str(tmp_path / "rejects"),
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["records"], figures["clicks"], figures["rejected"]) == (20010, 20000, 10)
    assert figures["sessions"] == 1233
    assert figures["read_partitions"] == 2 * 8


@pytest.mark.integration
@pytest.mark.brokers("tansu")
async def test_a_read_that_returns_nothing_from_a_full_topic_is_an_error(
    spark: SparkSession, broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard against an empty read: whatever makes the read come back empty (here a
    read replaced by an empty one), records on the broker mean it must fail."""
    from keyshard.spark_jobs import pipeline
    from keyshard.spark_jobs.reading import spark_schema

    bootstrap = broker.bootstrap_servers
    await clickstream.ensure_topic(bootstrap, TOPIC, partitions=2)
    await clickstream.produce(bootstrap, TOPIC, clickstream.events(users=5, count=50, seed=1))
    empty = spark.createDataFrame([], schema=spark_schema())
    monkeypatch.setattr(pipeline, "read_records", lambda *_: empty)

    with pytest.raises(pipeline.NothingRead, match=r"read 0 records of \['clicks'\].*50 offsets"):
        run_pipeline(spark, bootstrap_servers=bootstrap, topics=[TOPIC], output=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()
