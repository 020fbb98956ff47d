"""Bad input to the `keyshard` source fails the read or the query with a message that says
what is wrong (Spark wraps it; the source's own words are inside)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

from harness import CoordinatorProcess, create_topic, wait_for
from harness.brokers import Broker
from keyshard.local.processes import free_port
from keyshard.spark_jobs.source import register
from tests.tls_files import make_tls_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu", "kafka")]


@pytest.fixture
async def topic(spark: SparkSession, broker: Broker) -> str:
    register(spark)
    await create_topic(broker.bootstrap_servers, "present", partitions=1)
    return "present"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "present"}, "option 'bootstrap_servers' is required"),
        ({"bootstrap_servers": "{broker}"}, "option 'topics' is required"),
        ({"bootstrap_servers": "{broker}", "topics": "absent"}, r"unknown topic\(s\) \['absent'\]"),
        (
            {"bootstrap_servers": "{broker}", "topics": "present", "starting_positions": "{x"},
            "option 'starting_positions' is not JSON",
        ),
        (
            {"bootstrap_servers": "{broker}", "topics": "present", "ranges": "0"},
            r"option 'ranges'=0 is outside 1\.\.65536",
        ),
        (
            {
                "bootstrap_servers": "{broker}",
                "topics": "present",
                "kafka.security.protocol": "TLS",
            },
            r"Kafka options: security.protocol='TLS': expected one of",
        ),
        (
            {"bootstrap_servers": "{broker}", "topics": "present", "kafka.group.id": "g"},
            r"Kafka options: group.id cannot be set here",
        ),
    ],
)
def test_bad_batch_reads_are_refused(
    spark: SparkSession,
    broker: Broker,
    topic: str,
    options: dict[str, str],
    message: str,
) -> None:
    reader = spark.read.format("keyshard")
    for key, value in options.items():
        reader = reader.option(key, value.replace("{broker}", broker.bootstrap_servers))
    with pytest.raises(AnalysisException, match=message):
        reader.load().collect()


def _run_stream(spark: SparkSession, options: dict[str, str]) -> None:
    reader = spark.readStream.format("keyshard")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = reader.load().writeStream.format("noop").start()
    try:
        query.awaitTermination(60)
    finally:
        query.stop()


def test_a_stream_without_a_reachable_coordinator_fails_clearly(
    spark: SparkSession, broker: Broker, topic: str
) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    options = {
        "group": "g",
        "topics": topic,
        "coordinator": nobody,
        "bootstrap_servers": broker.bootstrap_servers,
        "connect_timeout_ms": "2000",
    }
    with pytest.raises(StreamingQueryException, match=f"coordinator unreachable.*{nobody}"):
        _run_stream(spark, options)


@pytest.mark.parametrize(
    ("drop", "extra", "message"),
    [
        ("group", {}, "option 'group' is required"),
        ("coordinator", {}, "option 'coordinator' is required"),
        (None, {"coordinator": "nohost"}, "option 'coordinator': coordinator address 'nohost'"),
        (None, {"capacity": "0"}, r"option 'capacity'=0 is outside 1\.\.100000"),
        (None, {"topics": "absent"}, r"unknown topic\(s\) \['absent'\]"),
    ],
)
def test_bad_stream_options_are_refused(
    spark: SparkSession,
    broker: Broker,
    topic: str,
    drop: str | None,
    extra: dict[str, str],
    message: str,
) -> None:
    options = {
        "group": "g",
        "topics": topic,
        "coordinator": f"127.0.0.1:{free_port()}",
        "bootstrap_servers": broker.bootstrap_servers,
        **extra,
    }
    options.pop(drop or "", None)
    with pytest.raises(StreamingQueryException, match=message):
        _run_stream(spark, options)


@pytest.mark.coordinator_args("--auth-token", "right-token")
async def test_a_stream_with_a_wrong_token_is_refused_by_the_coordinator(
    spark: SparkSession, broker: Broker, coordinator: CoordinatorProcess, topic: str
) -> None:
    options = {
        "group": "g",
        "topics": topic,
        "coordinator": coordinator.address,
        "bootstrap_servers": broker.bootstrap_servers,
        "auth_token": "wrong-token",
    }
    with pytest.raises(StreamingQueryException, match="coordinator refused registration"):
        _run_stream(spark, options)


@pytest.mark.brokers("tansu")
async def test_a_stream_reaches_a_tls_coordinator_only_with_coordinator_tls(
    spark: SparkSession, broker: Broker, topic: str, tmp_path: Path
) -> None:
    tls = make_tls_files(tmp_path / "tls")
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers,
        tmp_path,
        extra=["--tls-cert-file", str(tls.server.cert), "--tls-key-file", str(tls.server.key)],
    )
    options = {
        "group": "tls-g",
        "topics": topic,
        "coordinator": coordinator.address,
        "bootstrap_servers": broker.bootstrap_servers,
    }
    try:
        await coordinator.start()
        with pytest.raises(StreamingQueryException, match="requires TLS on its consumer channel"):
            _run_stream(spark, options)
        with pytest.raises(StreamingQueryException, match="option 'coordinator_tls_ca_file': /no"):
            _run_stream(spark, {**options, "coordinator_tls_ca_file": "/nope.pem"})
        reader = spark.readStream.format("keyshard")
        for key, value in {**options, "coordinator_tls_ca_file": str(tls.ca)}.items():
            reader = reader.option(key, value)
        query = reader.load().writeStream.format("noop").start()
        try:
            view = await wait_for(lambda: coordinator.group("tls-g"), 60, "the query's member")
            assert len(view["members"]) == 1
        finally:
            query.stop()
    finally:
        coordinator.stop()
