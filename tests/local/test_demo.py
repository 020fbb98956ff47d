"""`keyshard demo` ends tidily: the terminal gets the progress and the report only, every
component's log is a file in the output folder, and stopping in dependency order
(consumers, coordinator, broker) leaves no error in any of them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from harness.brokers.kafka import KAFKA_INTERNAL_TOPICS, KafkaBroker

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_demo_keeps_component_logs_in_its_folder_and_ends_clean(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["--records", "4000", "--keys", "100", "--consumers", "2", "--rate", "2000"]
    result = subprocess.run(
        [sys.executable, "-m", "keyshard", "demo", *args, "--output", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr == "", "component logs reached the terminal"
    assert "verdict: OK" in result.stdout
    assert " INFO " not in result.stdout and "ERROR" not in result.stdout
    logs = {path.name: path.read_text() for path in out.glob("*.log")}
    assert set(logs) == {"broker.log", "coordinator.log", "consumer-0.log", "consumer-1.log",
                         "consumer-2.log"}  # fmt: skip
    assert "joined group demo" in logs["coordinator.log"]
    for name, text in logs.items():
        assert "ERROR" not in text and "Traceback" not in text, f"{name}:\n{text[-3000:]}"


def test_the_demo_checks_hold_on_apache_kafka(kafka: KafkaBroker, tmp_path: Path) -> None:
    """`keyshard demo --bootstrap-servers` runs the same checks on a real Kafka, in a topic
    and state topic of its own that it deletes afterwards."""
    out = tmp_path / "demo"
    args = ["--records", "4000", "--keys", "100", "--consumers", "2", "--rate", "2000"]
    args += ["--bootstrap-servers", kafka.bootstrap_servers]
    result = subprocess.run(
        [sys.executable, "-m", "keyshard", "demo", *args, "--output", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verdict: OK" in result.stdout
    assert "broker.log" not in {path.name for path in out.glob("*.log")}
    assert asyncio.run(non_internal_topics(kafka.bootstrap_servers)) == []


async def non_internal_topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if t not in KAFKA_INTERNAL_TOPICS]
    finally:
        await admin.close()
