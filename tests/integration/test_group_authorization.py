"""Per-group authorization on the secured Kafka of the tests (SASL_SSL, the authorizer on):
the coordinator authorizes each Register with the cluster's own ACLs (Read on the Group
and on its Topics), read with DescribeAcls and cached for `--acl-cache-ms`.

A principal with Read on group A only registers in A and is refused in B, naming what it
lacks; granting Read on B lets it in without a restart; revoking it fences the member
running in B and refuses its next Register. Once with per-principal tokens, once with
mutual TLS identities, where a connection of another principal cannot adopt a member's
claim either.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme

from harness import CoordinatorProcess, create_topic, wait_for
from harness.brokers import Broker
from harness.brokers.kafka import run_tool
from keyshard.consumer_client import ConsumerError, CoordinatedConsumer
from keyshard.coordinator.storage.base import StoreError
from keyshard.coordinator.storage.kafka_cluster import KafkaCluster
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.messages import (
    MemberClaim,
    RegisterRequest,
    RegisterResponse,
)
from keyshard.core.security.acl import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from keyshard.core.security.tls import ClientTls
from tests.conftest import SECURED_PREFIX, SecuredKafka
from tests.coordinator.server.test_principals import answer
from tests.integration.test_secured_kafka import coordinator_args

pytestmark = pytest.mark.integration
CACHE_MS = 1000
# Well past the cache bound: a grant or revocation counts by then, or it is a failure.
WITHIN_S = 30
TOKEN = "Zq9-app-token"


def acl(secured: SecuredKafka, change: str, principal: str, *resource: str) -> None:
    """kafka-acls as the cluster's admin: `change` is --add or --remove."""
    done = run_tool(
        "org.apache.kafka.tools.AclCommand",
        "--bootstrap-server", secured.broker.bootstrap_servers, change, "--force",
        "--allow-principal", principal, "--operation", "Read", *resource,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def may_read_acls(secured: SecuredKafka) -> None:
    """The coordinator's principal reads the cluster's ACLs: Describe on the Cluster."""
    done = run_tool(
        "org.apache.kafka.tools.AclCommand",
        "--bootstrap-server", secured.broker.bootstrap_servers, "--add",
        "--allow-principal", "User:keyshard", "--operation", "Describe", "--cluster",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


async def outcome(consumer: CoordinatedConsumer, settled: Callable[[], Awaitable[object]]) -> str:
    """ "registered" once the consumer's group has it settled, or its ConsumerError."""
    running = asyncio.ensure_future(consumer.run(lambda record: asyncio.sleep(0)))
    try:
        done = asyncio.ensure_future(wait_for(settled, WITHIN_S, "the consumer settled"))
        await asyncio.wait({running, done}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            done.cancel()
            try:
                running.result()
            except ConsumerError as err:
                return str(err)
            return "stopped"
        await done
        return "registered"
    finally:
        if not running.done():
            consumer.request_stop()
            await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 30)


async def until_outcome(
    attempt: Callable[[], Awaitable[str]], predicate: Callable[[str], bool], what: str
) -> str:
    """Register again (a fresh consumer each time) until the outcome is as expected: the
    cached ACLs are read again within CACHE_MS."""
    last = ""
    async with asyncio.timeout(WITHIN_S):
        while True:
            last = await attempt()
            if predicate(last):
                return last
            await asyncio.sleep(CACHE_MS / 1000 / 2)
    raise AssertionError(f"{what}: {last}")  # pragma: no cover - the timeout raises


async def test_a_principal_joins_only_the_groups_its_kafka_acls_allow(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    topic = f"{SECURED_PREFIX}{tmp_path.name}"
    group_a, group_b = f"{topic}.a", f"{topic}.b"
    admin = secured_kafka.client_config("admin")
    await create_topic(secured_kafka.address, topic, kafka_config=admin)
    may_read_acls(secured_kafka)
    acl(secured_kafka, "--add", "User:app", "--group", group_a)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"User:app {TOKEN}\n")
    coordinator = CoordinatorProcess(
        secured_kafka.address, tmp_path,
        extra=[
            *coordinator_args(secured_kafka, tmp_path, "keyshard"),
            "--authorizer", "kafka", "--acl-cache-ms", str(CACHE_MS),
            "--auth-tokens-file", str(tokens),
        ],
    )  # fmt: skip
    app = secured_kafka.client_config("app")

    def consumer(group: str) -> CoordinatedConsumer:
        return CoordinatedConsumer(
            group=group, topics=[topic], coordinator=coordinator.address,
            bootstrap_servers=secured_kafka.address, kafka_config=app, auth_token=TOKEN,
            session_timeout_ms=3000, handle_signals=False,
        )  # fmt: skip

    async def join(group: str) -> str:
        return await outcome(consumer(group), lambda: coordinator.settled(1, group))

    try:
        await coordinator.start()
        assert await join(group_a) == "registered"
        refused = await join(group_b)
        assert "AUTHORIZATION_FAILED" in refused
        assert f"User:app may not join group '{group_b}': it lacks Read on Group" in refused
        acl(secured_kafka, "--add", "User:app", "--group", group_b)
        await until_outcome(lambda: join(group_b), lambda o: o == "registered", "granted")
        # Revoked while a member runs in B: it is fenced, and its Register is refused.
        member_b = consumer(group_b)
        running = asyncio.ensure_future(member_b.run(lambda record: asyncio.sleep(0)))
        try:
            await wait_for(lambda: coordinator.settled(1, group_b), WITHIN_S, "B's member")
            acl(secured_kafka, "--remove", "User:app", "--group", group_b)
            with pytest.raises(ConsumerError, match="AUTHORIZATION_FAILED"):
                await asyncio.wait_for(asyncio.shield(running), WITHIN_S)
        finally:
            if not running.done():
                member_b.request_stop()
            await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 30)
        assert "AUTHORIZATION_FAILED" in await join(group_b)
        log = coordinator.read_log()
        assert TOKEN not in log
        assert f"joined group {group_a} (User:app," in log
    finally:
        coordinator.stop()


# ---- mutual TLS identities -----------------------------------------------------------------


class Identities:
    """A CA for the coordinator's channel, its certificate, and client certificates whose
    organizational unit is the team (`--ssl-principal-mapping-rules` maps it)."""

    RULES = "RULE:^CN=.*?,OU=(.*?),.*$/$1/L, DEFAULT"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA(organization_name="Example")
        self.ca_file = directory / "channel-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.server = directory / "channel-server.pem"
        self.ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            str(self.server)
        )

    def client(self, team: str) -> ClientTls:
        issued = self.ca.issue_cert(f"svc@{team}.example", common_name="svc",
                                    organization_unit_name=team)  # fmt: skip
        path = self.directory / f"{team}.pem"
        issued.private_key_and_cert_chain_pem.write_to_path(str(path))
        return ClientTls(str(self.ca_file), str(path), str(path))

    def coordinator_flags(self) -> list[str]:
        return [
            "--tls-cert-file", str(self.server), "--tls-client-ca-file", str(self.ca_file),
            "--ssl-principal-mapping-rules", self.RULES,
        ]  # fmt: skip


@asynccontextmanager
async def member(
    port: int, tls: ssl.SSLContext, group: str, topic: str, claim: MemberClaim | None = None
) -> AsyncIterator[tuple[Channel, RegisterResponse]]:
    """A protocol-level member (raw channel): what a claim needs, a member id to name."""
    channel = await Channel.connect("127.0.0.1", port, ssl=tls, name="member")
    channel.set_request_handler(answer)
    channel.start()
    try:
        request = RegisterRequest(
            correlation_id=0, group=group, topics=[topic], consumer_name="raw",
            session_timeout_ms=10_000, claim=claim,
        )  # fmt: skip
        response = await channel.request(request, timeout=30)
        assert isinstance(response, RegisterResponse)
        yield channel, response
    finally:
        await channel.aclose()


async def principals(coordinator: CoordinatorProcess, group: str) -> dict[str, str]:
    view = await coordinator.group(group)
    assert view is not None
    return {m["member_id"]: m["principal"] for m in view["members"]}


async def test_mutual_tls_identities_are_authorized_and_keep_their_claims(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    topic = f"{SECURED_PREFIX}{tmp_path.name}"
    group_a, group_b = f"{topic}.a", f"{topic}.b"
    admin = secured_kafka.client_config("admin")
    await create_topic(secured_kafka.address, topic, kafka_config=admin)
    may_read_acls(secured_kafka)
    for team in ("team-a", "team-b"):
        acl(secured_kafka, "--add", f"User:{team}", "--topic", topic)
    acl(secured_kafka, "--add", "User:team-a", "--group", group_a)
    identities = Identities(tmp_path)
    coordinator = CoordinatorProcess(
        secured_kafka.address, tmp_path,
        extra=[
            *coordinator_args(secured_kafka, tmp_path, "keyshard"),
            "--authorizer", "kafka", "--acl-cache-ms", str(CACHE_MS),
            *identities.coordinator_flags(),
        ],
    )  # fmt: skip
    team_a, team_b = identities.client("team-a"), identities.client("team-b")

    async def join(group: str, tls: ClientTls) -> str:
        consumer = CoordinatedConsumer(
            group=group, topics=[topic], coordinator=coordinator.address,
            bootstrap_servers=secured_kafka.address,
            kafka_config=secured_kafka.client_config("app"), coordinator_tls=tls,
            session_timeout_ms=3000, handle_signals=False,
        )  # fmt: skip
        return await outcome(consumer, lambda: coordinator.settled(1, group))

    try:
        await coordinator.start()
        assert await join(group_a, team_a) == "registered"
        refused = await join(group_b, team_a)
        assert f"User:team-a may not join group '{group_b}'" in refused
        acl(secured_kafka, "--add", "User:team-a", "--group", group_b)
        await until_outcome(lambda: join(group_b, team_a), lambda o: o == "registered", "granted")
        acl(secured_kafka, "--remove", "User:team-a", "--group", group_b)
        await until_outcome(
            lambda: join(group_b, team_a), lambda o: "AUTHORIZATION_FAILED" in o, "revoked"
        )

        # A claim: team A's member loses its connection while it owns every slot; team B,
        # allowed in the group too, names that member id and gets nothing of it.
        acl(secured_kafka, "--add", "User:team-b", "--group", group_a)
        await until_outcome(lambda: join(group_a, team_b), lambda o: o == "registered", "B in A")
        port = coordinator.listen_port
        async with member(port, team_a.context(), group_a, topic) as (_, alice):
            await wait_for(
                lambda: coordinator.settled(1, group_a), WITHIN_S, "team A's member owns all"
            )
        claim = MemberClaim(
            member_id=alice.member_id, member_epoch=alice.member_epoch, owned=[(0, 65535)],
            positions=[], coordinator_epoch=alice.coordinator_epoch,
        )  # fmt: skip
        async with member(port, team_b.context(), group_a, topic, claim) as (_, bob):
            assert bob.member_id != alice.member_id and bob.adopted == []
            assert await principals(coordinator, group_a) == {bob.member_id: "User:team-b"}
        async with member(port, team_a.context(), group_a, topic, claim) as (_, back):
            assert back.member_id == alice.member_id and back.adopted == [(0, 65535)]
            view = await principals(coordinator, group_a)
            assert view[alice.member_id] == "User:team-a"
        assert "sent a claim for member" in coordinator.read_log()
    finally:
        coordinator.stop()


# ---- reading the cluster's ACLs -------------------------------------------------------------


async def test_the_clusters_acls_are_read_and_a_missing_permission_is_named(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    """DescribeAcls through the coordinator's client: the bindings as kafka-acls made them;
    without Describe on the Cluster, the error says what to grant."""
    group = f"{SECURED_PREFIX}{tmp_path.name}"
    acl(secured_kafka, "--add", "User:app", "--group", group)
    may_read_acls(secured_kafka)
    reader = KafkaCluster(
        secured_kafka.address, KafkaSettings.parse(secured_kafka.client_config("keyshard"))
    )
    await reader.start()
    try:
        bindings = await reader.describe_acls(ResourceType.GROUP)
    finally:
        await reader.stop()
    assert AclBinding(
        "User:app", Permission.ALLOW, Operation.READ, ResourceType.GROUP,
        PatternType.LITERAL, group,
    ) in bindings  # fmt: skip
    # The consumers' principal holds no Describe on the Cluster.
    app = KafkaCluster(secured_kafka.address, KafkaSettings.parse(secured_kafka.client_config()))
    await app.start()
    try:
        with pytest.raises(StoreError, match="grant User:app Describe on the Cluster"):
            await app.describe_acls(ResourceType.TOPIC)
    finally:
        await app.stop()


@pytest.mark.brokers("kafka")
async def test_a_cluster_without_an_authorizer_is_said(broker: Broker) -> None:
    cluster = KafkaCluster(broker.bootstrap_servers, KafkaSettings.parse())
    await cluster.start()
    try:
        with pytest.raises(StoreError, match="the cluster has no authorizer"):
            await cluster.describe_acls(ResourceType.GROUP)
    finally:
        await cluster.stop()
