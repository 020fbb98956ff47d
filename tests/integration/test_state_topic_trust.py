"""The state topic cannot be forged by a topic writer: a real coordinator, a real broker,
and records appended to the state topic by someone without the replica secret.

* A forged beat never receives the admin token: the admin API asks only replicas whose
  beat verified (a fake HTTP server records what reaches it), and without a secret none.
* A forged epoch marker with a huge epoch does not move a partition: the owner keeps
  serving the group, its consumers keep processing, Metadata still names the owner.
* A record nobody can read (`[]`) is skipped alone: the record after it in the same batch
  is applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import GROUP, CoordinatorProcess, Workers, append, create_topic, produce, wait_for
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, partition_of
from keyshard.coordinator.storage.log_format import (
    EpochMarker,
    ReplicaBeat,
    encode,
    encode_positions,
)
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.messages import MetadataRequest, MetadataResponse
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.verify import check

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu")]
ADMIN_TOKEN = "admin-" + secrets.token_hex(8)


@dataclass
class FakeAdminApi:
    """An HTTP server that answers every request like an empty replica and records it."""

    requests: list[str] = field(default_factory=list)  # each request's head, as sent
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.decode("latin-1"))
            body = b'{"groups": [], "unreachable": []}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def fake_admin_api() -> AsyncIterator[FakeAdminApi]:
    fake = FakeAdminApi()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    try:
        yield fake
    finally:
        server.close()
        await server.wait_closed()


def _secret_file(tmp_path: Path) -> tuple[Path, ReplicaSecret]:
    path = tmp_path / "replica-secret"
    path.write_text(secrets.token_urlsafe(32) + "\n")
    return path, ReplicaSecret.from_file(str(path))


def _record(record: ReplicaBeat | EpochMarker) -> tuple[bytes, bytes | None]:
    return record.key, encode(record)


@contextlib.asynccontextmanager
async def beating(
    coordinator: CoordinatorProcess, beats: list[tuple[ReplicaBeat, ReplicaSecret | None]]
) -> AsyncIterator[None]:
    """Keep appending these beats (each signed by its secret, or not), as live replicas
    would, until the block ends."""

    async def loop() -> None:
        while True:
            for beat, secret in beats:
                await append(
                    coordinator.bootstrap, coordinator.state_topic, 0, _record(beat),
                    signed_by=secret,
                )  # fmt: skip
            await asyncio.sleep(0.2)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _groups(coordinator: CoordinatorProcess) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with coordinator.client() as client:
        answer = await client.get(f"{coordinator.admin_url}/v1/groups", headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


@pytest.mark.parametrize("signed", [True, False], ids=["with-secret", "without-secret"])
async def test_a_forged_beat_never_receives_the_admin_token(
    broker: EmbeddedBroker, tmp_path: Path, signed: bool
) -> None:
    secret_path, secret = _secret_file(tmp_path)
    token_path = tmp_path / "admin-token"
    token_path.write_text(ADMIN_TOKEN + "\n")
    extra = ["--admin-token-file", str(token_path), "--admin-auth-reads"]
    extra += ["--replica-secret-file", str(secret_path)] if signed else []
    coordinator = CoordinatorProcess(broker.bootstrap_servers, tmp_path, extra=extra)
    async with fake_admin_api() as forged_api, fake_admin_api() as insider_api:
        forged = ReplicaBeat("forger", "127.0.0.1:1", forged_api.url, 0)
        # A control: a beat signed with the replicas' secret is a replica's, and is asked.
        insider = ReplicaBeat("insider", "127.0.0.1:2", insider_api.url, 0)
        try:
            await coordinator.start()
            async with beating(coordinator, [(forged, None), (insider, secret)]):
                if signed:

                    async def insider_asked() -> bool:
                        await _groups(coordinator)  # a replica asks the others now
                        return bool(insider_api.requests)

                    await wait_for(insider_asked, 30, "the signed replica to be asked")
                    assert f"authorization: Bearer {ADMIN_TOKEN}" in insider_api.requests[0]
                else:
                    view = await wait_for(
                        lambda: _unverified_listed(coordinator, {"forger", "insider"}),
                        30, "both replicas listed as unverified",
                    )  # fmt: skip
                    assert view["unreachable"] == []
                    assert not insider_api.requests  # without a secret nobody is asked
                for _ in range(5):  # and the forger, alive all along, never is
                    await _groups(coordinator)
        finally:
            coordinator.stop()
    assert forged_api.requests == []
    log = coordinator.read_log()
    if signed:
        assert "ignoring the beat (forger, " in log and "it is not signed" in log
    else:
        assert "the state topic" in log and "is unauthenticated" in log


async def _unverified_listed(
    coordinator: CoordinatorProcess, replicas: set[str]
) -> dict[str, object] | None:
    view = await _groups(coordinator)
    listed = view.get("unverified")
    return view if isinstance(listed, list) and replicas <= set(listed) else None


async def test_a_forged_epoch_marker_does_not_move_a_partition(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    secret_path, _ = _secret_file(tmp_path)
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers, tmp_path, extra=["--replica-secret-file", str(secret_path)]
    )
    workers = Workers(coordinator, tmp_path)
    partition = partition_of(GROUP, DEFAULT_STATE_PARTITIONS)
    try:
        await create_topic(broker.bootstrap_servers)
        await coordinator.start()
        for name in ("c0", "c1"):
            workers.spawn(name)
        before = await wait_for(lambda: coordinator.settled(2), 30, "two members settled")
        producing = asyncio.ensure_future(produce(broker.bootstrap_servers, 3000, 100, rate=300))
        await wait_for(lambda: workers.unique() >= 300, 30, "records processed")

        def marker(epoch: int) -> tuple[bytes, bytes | None]:
            return _record(EpochMarker(partition, epoch, "forger", "127.0.0.1:1", "http://x"))

        forger_secret = ReplicaSecret.from_text(secrets.token_urlsafe(32))
        await append(broker.bootstrap_servers, coordinator.state_topic, partition, marker(2**40))
        await append(
            broker.bootstrap_servers, coordinator.state_topic, partition, marker(2**20),
            signed_by=forger_secret,
        )  # fmt: skip
        await wait_for(
            lambda: coordinator.read_log().count("ignoring the epoch marker") >= 2 or None,
            20, "the coordinator to read both markers",
        )  # fmt: skip
        produced = await asyncio.wait_for(producing, 60)
        await wait_for(lambda: workers.unique() >= len(produced), 60, "every record processed")
        report = check(produced, workers.processed())
        assert report.ok, report

        after = await coordinator.settled(2)
        assert after is not None
        assert after["served_by"] == before["served_by"]  # same replica, same epoch
        assert sorted(m["member_id"] for m in after["members"]) == sorted(
            m["member_id"] for m in before["members"]
        )
        channel = await Channel.connect("127.0.0.1", coordinator.listen_port)
        channel.start()
        try:
            answer = await channel.request(
                MetadataRequest(correlation_id=0, group=GROUP), timeout=5
            )
        finally:
            await channel.aclose()
        assert isinstance(answer, MetadataResponse)
        assert (answer.coordinator, answer.active) == (coordinator.address, True)
        assert "NOT_COORDINATOR" not in "".join(workers.output(n, "err") for n in ("c0", "c1"))
    finally:
        workers.stop_all()
        coordinator.stop()


async def test_a_record_nobody_can_read_is_skipped_alone(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """`[]` and, right after it in the same batch, a group's positions: a coordinator
    starting on that state topic serves the group from those positions."""
    coordinator = CoordinatorProcess(broker.bootstrap_servers, tmp_path)
    group = "after-the-junk"
    positions = RangePositionMap(Position(42))
    ((key, value),) = encode_positions(group, ("t", 0), positions, epoch=0)
    await create_topic(
        broker.bootstrap_servers, coordinator.state_topic, partitions=DEFAULT_STATE_PARTITIONS
    )
    partition = partition_of(group, DEFAULT_STATE_PARTITIONS)
    junk = (b"P\x00" + group.encode() + b"\x00junk", b"[]")
    await append(broker.bootstrap_servers, coordinator.state_topic, partition, junk, (key, value))
    try:
        await coordinator.start()
        view = await wait_for(lambda: coordinator.group(group), 20, "the group served")
    finally:
        coordinator.stop()
    ((segment,),) = [p["segments"] for p in view["partitions"] if p["topic"] == "t"]
    assert (segment["start"], segment["end"], segment["next_offset"]) == (0, 65535, 42)
    assert f"skipping unreadable state record {partition}/0" in coordinator.read_log()
