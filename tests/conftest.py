"""Shared fixtures. Keep this small; group fixtures by area when adding more."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import settings

from harness import CoordinatorProcess, Workers
from harness.brokers import Broker, running_broker
from harness.brokers.kafka import (
    SASL_SSL,
    KafkaBroker,
    KafkaUnavailable,
    missing_tools,
    run_tool,
    secured_broker,
)
from harness.brokers.kafka_cluster import KafkaCluster
from keyshard.local.broker import EmbeddedBroker
from tests.tls_files import TlsFiles, make_tls_files

#: Brokers a test using the `broker` fixture runs on, unless marked `brokers(...)`.
DEFAULT_BROKERS = ("tansu", "kafka")

# CI explores a fixed sequence of examples (a red CI then means a change broke something,
# not that chance found an old case); local runs keep exploring at random.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that uses `broker` once per broker kind: `@pytest.mark.brokers(...)`
    names them (default DEFAULT_BROKERS); test ids end in [tansu] / [kafka]."""
    if "broker" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("brokers")
        kinds = marker.args if marker else DEFAULT_BROKERS
        metafunc.parametrize("broker", kinds, indirect=True)


def _require_kafka_tools() -> None:
    reason = missing_tools()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Apache Kafka tests must run in CI: {reason}")
        pytest.skip(f"Apache Kafka tests skipped: {reason}")


_Kafka = TypeVar("_Kafka", KafkaBroker, KafkaCluster)


def _serving(kafka: _Kafka) -> Iterator[_Kafka]:
    """`kafka` started for a session fixture and stopped after it; skipped with the
    reason when it cannot start, except under CI=true."""
    _require_kafka_tools()
    try:
        kafka.start()
    except KafkaUnavailable as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Apache Kafka tests skipped: {err}")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[KafkaBroker]:
    """One Apache Kafka node for the whole session (a JVM start costs ~5 s); every test
    gets it emptied (`kafka` fixture). Skips with the reason when Java or Maven is missing,
    except under CI=true, where the Kafka tests must run."""
    yield from _serving(KafkaBroker())


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes (replication factor 3, min ISR 2) for the whole session,
    started only by a test that asks for it (~13 s, more on a busy machine); each test
    gets it whole and emptied (`kafka3`)."""
    yield from _serving(KafkaCluster())


@pytest.fixture
async def kafka3(kafka_cluster: KafkaCluster) -> KafkaCluster:
    """The session's 3-node cluster with every node up (a test may have stopped one), no
    topics left from earlier tests, and every partition in sync."""
    await asyncio.to_thread(kafka_cluster.reset)
    await kafka_cluster.wait_in_sync()
    return kafka_cluster


@dataclass(frozen=True)
class SecuredKafka:
    """A Kafka node with a SASL_SSL listener (SCRAM-SHA-512 users, a test CA) and the
    settings a client needs to use it as `app`."""

    broker: KafkaBroker
    tls: TlsFiles
    users: dict[str, str]

    @property
    def address(self) -> str:
        return self.broker.listener(SASL_SSL)

    def client_config(self, user: str = "app", **overrides: str) -> dict[str, str]:
        """What a client of `user` puts in its Kafka settings (Kafka's own names)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": self.users[user],
            "ssl.ca.location": str(self.tls.ca),
            **overrides,
        }


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """One SASL_SSL Kafka node for the session (its own JVM: the plain node stays plain),
    with the authorizer on and the ACLs README 'Running on Apache Kafka' lists: `keyshard`
    has the coordinator's, `app` a consumer's, `limited` the coordinator's but Write on
    the state topic; `admin` and the PLAINTEXT listener are super users."""
    _require_kafka_tools()
    tls = make_tls_files(tmp_path_factory.mktemp("kafka-tls"))
    users = {name: f"{name}-secret-{i}" for i, name in enumerate(SECURED_USERS)}
    broker = secured_broker(
        ca=tls.ca, cert=tls.server.cert, key=tls.server.key, users=users, authorizer=True
    )
    broker.start()
    try:
        for principal, grants in ACLS.items():
            for resource, name, operations in grants:
                grant(broker, principal, resource, name, operations)
        yield SecuredKafka(broker, tls, users)
    finally:
        broker.stop()


#: What each test principal may do; the README's ACL table says the same in prose.
SECURED_USERS = ("admin", "keyshard", "app", "limited")
SECURED_PREFIX = "secure."  # topics and groups of the secured tests start with this
#: (resource type, name prefix, operations)
Acl = tuple[str, str, tuple[str, ...]]
_COORDINATOR_ACLS: list[Acl] = [
    ("topic", "__keyshard", ("Create", "Describe", "DescribeConfigs", "Read", "Write")),
    # Read: committing a group's low watermark as a Kafka offset needs it (Describe alone
    # gives partition counts, not offset commits).
    ("topic", SECURED_PREFIX, ("Describe", "Read")),
    ("group", SECURED_PREFIX, ("Read", "Describe")),
    # HA: the replicas place state partitions as a Kafka group, and each partition's
    # writer is a transactional producer, so the broker fences a replaced replica.
    ("group", "keyshard-coordinators.__keyshard", ("Read", "Describe")),
    ("transactional-id", "keyshard.__keyshard", ("Write", "Describe")),
]
ACLS: dict[str, list[Acl]] = {
    "keyshard": _COORDINATOR_ACLS,
    "app": [("topic", SECURED_PREFIX, ("Read", "Describe", "Write"))],
    "limited": [
        ("topic", "__keyshard", ("Create", "Describe", "DescribeConfigs", "Read")),
        *_COORDINATOR_ACLS[1:],
    ],
}


def grant(
    broker: KafkaBroker, principal: str, resource: str, prefix: str, operations: tuple[str, ...]
) -> None:
    args = [
        "--bootstrap-server",
        broker.bootstrap_servers,
        "--add",
        "--allow-principal",
        f"User:{principal}",
        f"--{resource}",
        prefix,
        "--resource-pattern-type",
        "prefixed",
    ]
    for operation in operations:
        args += ["--operation", operation]
    done = run_tool("org.apache.kafka.tools.AclCommand", *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def kafka(kafka_server: KafkaBroker) -> KafkaBroker:
    """The session's Kafka node with no topics left from earlier tests."""
    if not kafka_server.running:
        kafka_server.start()  # a test stopped it: start it again rather than fail the rest
    kafka_server.reset()
    return kafka_server


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker with nothing on it: a fresh in-memory Tansu on a free port (stopped after
    the test), or the session's Apache Kafka node, emptied."""
    if request.param == "kafka":
        yield request.getfixturevalue("kafka")
        return
    with running_broker("tansu") as tansu:
        yield tansu


@pytest.fixture
async def coordinator(
    broker: EmbeddedBroker, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[CoordinatorProcess]:
    """A coordinator daemon process on the test's broker, with a 2 s drain deadline and
    any extra flags from `@pytest.mark.coordinator_args(...)`."""
    marker = request.node.get_closest_marker("coordinator_args")
    extra = ["--drain-timeout-ms", "2000", *(marker.args if marker else ())]
    coord = CoordinatorProcess(broker.bootstrap_servers, tmp_path, extra=extra)
    try:
        await coord.start()
        yield coord
    finally:
        coord.stop()


@pytest.fixture
def workers(coordinator: CoordinatorProcess, tmp_path: Path) -> Iterator[Workers]:
    """Consumer worker processes on `coordinator`, all stopped (by pid) afterwards."""
    w = Workers(coordinator, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No KEYSHARD_* from the test run's own environment leaks into build_parser()."""
    for key in list(os.environ):
        if key.startswith("KEYSHARD_"):
            monkeypatch.delenv(key)
    return monkeypatch
