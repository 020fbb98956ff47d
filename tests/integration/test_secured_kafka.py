"""keyshard on a secured Apache Kafka: SASL_SSL with SCRAM-SHA-512 over TLS (a test CA),
the authorizer on, and each principal holding only the ACLs the README lists.

The coordinator (principal `keyshard`) and the consumers (`app`) run the join / graceful
leave / kill -9 flow under keyed traffic: nothing lost, per-key order kept, duplicates only
from the killed consumer. Wrong settings end in one clear line, with no secret in it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.consumer_client import ConsumerError, CoordinatedConsumer
from keyshard.local.processes import free_port
from keyshard.local.verify import check
from tests.conftest import SECURED_PREFIX, SecuredKafka

pytestmark = pytest.mark.integration
SESSION = ("--session-timeout-ms", "3000")
REPO = Path(__file__).resolve().parents[2]


def properties(path: Path, config: dict[str, str]) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    return str(path)


def coordinator_args(secured: SecuredKafka, tmp_path: Path, user: str) -> list[str]:
    config = properties(tmp_path / f"{user}.properties", secured.client_config(user))
    # A state topic of the test's own: the secured broker serves the whole session.
    state = f"__keyshard_state.{tmp_path.name}"
    return ["--kafka-config", config, "--state-topic", state, "--drain-timeout-ms", "2000"]


async def test_join_leave_and_kill_on_sasl_ssl(secured_kafka: SecuredKafka, tmp_path: Path) -> None:
    topic = group = f"{SECURED_PREFIX}{tmp_path.name}"
    admin = secured_kafka.client_config("admin")
    await create_topic(secured_kafka.address, topic, kafka_config=admin)
    coordinator = CoordinatorProcess(
        secured_kafka.address, tmp_path, extra=coordinator_args(secured_kafka, tmp_path, "keyshard")
    )
    app = properties(tmp_path / "app.properties", secured_kafka.client_config("app"))
    workers = Workers(coordinator, tmp_path, topic=topic, group=group, kafka_config=app)
    try:
        await coordinator.start()
        for i in range(3):
            workers.spawn(f"c{i}", *SESSION)
        await wait_for(lambda: coordinator.settled(3, group), 60, "3 consumers settled")
        producing = asyncio.ensure_future(
            produce(secured_kafka.address, 6000, 300, topic=topic, rate=1000, kafka_config=admin)
        )
        await wait_for(lambda: workers.unique() > 1000, 30, "traffic flowing")
        workers.spawn("c3", *SESSION)  # join
        await wait_for(lambda: coordinator.settled(4, group), 30, "c3 has ranges")
        workers.stop("c0")  # graceful leave: SIGTERM
        await wait_for(lambda: coordinator.settled(3, group), 30, "c0 left")
        workers.kill("c1")  # crash
        await wait_for(lambda: coordinator.settled(2, group), 30, "c1's ranges moved")
        produced = await producing
        await wait_for(lambda: workers.unique() >= len(produced), 60, "every record processed")
    finally:
        workers.stop_all()
        coordinator.stop()
    report = check(produced, workers.processed())
    assert report.lost == [] and report.order_violations == []
    runs: dict[tuple[int, int], set[str]] = {}
    for e in workers.processed():
        runs.setdefault((e.partition, e.offset), set()).add(e.worker)
    assert all("c1" in w for w in runs.values() if len(w) > 1), "duplicates only from c1"
    # aiokafka logs an ERROR while a fresh cluster creates __consumer_offsets, then retries.
    log = coordinator.read_log()
    errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert all("GroupCoordinatorNotAvailable" in line for line in errors), errors
    assert "could not commit" not in log, "the ACLs cover the offset commits too"
    assert secured_kafka.users["keyshard"] not in log


def run_coordinator(secured: SecuredKafka, tmp_path: Path, config: dict[str, str]) -> str:
    """A coordinator that must refuse to start: its stderr (it has 60 s to exit)."""
    props = properties(tmp_path / "coordinator.properties", config)
    result = subprocess.run(
        [
            sys.executable, "-m", "keyshard", "coordinator",
            "--bootstrap-servers", secured.address, "--kafka-config", props,
            "--state-topic", f"__keyshard_state.{tmp_path.name}",
            "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_wrong_password_stops_the_coordinator_with_one_line(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    config = secured_kafka.client_config("keyshard", **{"sasl.password": "not-the-password"})
    line = run_coordinator(secured_kafka, tmp_path, config)
    assert "refused the SASL SCRAM-SHA-512 credentials (sasl.username='keyshard')" in line
    assert "check sasl.username and sasl.password" in line and "not-the-password" not in line


def test_a_principal_that_may_not_write_the_state_topic_stops_the_coordinator(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    line = run_coordinator(secured_kafka, tmp_path, secured_kafka.client_config("limited"))
    assert "Kafka refused Write on topic '__keyshard_state." in line
    assert "--allow-principal User:limited --operation Write" in line


def test_an_untrusted_broker_certificate_stops_the_coordinator(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    other = str(secured_kafka.tls.other_ca)
    line = run_coordinator(
        secured_kafka,
        tmp_path,
        secured_kafka.client_config("keyshard", **{"ssl.ca.location": other}),
    )
    assert "is not trusted" in line and "check ssl.ca.location" in line


async def test_a_wrong_password_makes_the_consumer_raise(secured_kafka: SecuredKafka) -> None:
    config = secured_kafka.client_config("app", **{"sasl.password": "wrong-one"})
    consumer = CoordinatedConsumer(
        group=f"{SECURED_PREFIX}g", topics=[f"{SECURED_PREFIX}t"], coordinator="127.0.0.1:9",
        bootstrap_servers=secured_kafka.address, kafka_config=config,
    )  # fmt: skip
    began = time.monotonic()
    with pytest.raises(ConsumerError, match=r"refused the SASL SCRAM-SHA-512 credentials") as err:
        await consumer.run(lambda record: asyncio.sleep(0))
    assert "wrong-one" not in str(err.value) and time.monotonic() - began < 30
