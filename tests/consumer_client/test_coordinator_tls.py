"""The consumer's channel over TLS: it registers, and every TLS mistake is a
`ConsumerError` that names the setting to fix, while the coordinator logs one line and
carries on.

An in-process coordinator behind its real listener; the consumer side is `Membership`,
the code `CoordinatedConsumer` and the Spark source share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from pathlib import Path

import pytest
import trustme

from keyshard.consumer_client import (
    ClientTls,
    ConsumerError,
    CoordinatedConsumer,
    Membership,
    PingReport,
    TopicsChange,
)
from keyshard.coordinator.server.admission import ConnectionLimits
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.model.ranges import EMPTY, RangeSet
from keyshard.core.security.tls import ServerTls, TlsConfigError
from tests.coordinator.server.inprocess import running_coordinator
from tests.tls_files import TlsFiles, make_tls_files

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


class Hooks:
    """A member that owns nothing and does nothing: only the protocol side runs."""

    def ping_reply(self) -> PingReport:
        return PingReport({})

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        pass

    def topics_changed(self, change: TopicsChange) -> None:
        pass

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]:
        async def drained() -> PositionUpdate:
            return {}

        return drained()

    async def session_lost(self) -> None:
        pass

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        return EMPTY, {}


def server_tls(tls: TlsFiles, *, mutual: bool = False) -> ServerTls:
    return ServerTls(str(tls.server.cert), str(tls.server.key), str(tls.ca) if mutual else None)


def client(tls: TlsFiles, *, ca: Path | None = None, cert: bool = False) -> ClientTls:
    return ClientTls(
        str(ca or tls.ca),
        str(tls.client.cert) if cert else None,
        str(tls.client.key) if cert else None,
    )


async def outcome(port: int, tls: ClientTls | None, host: str = "127.0.0.1") -> str:
    """`registered`, or the ConsumerError's message."""
    membership = Membership(
        group="g", topics=["t"], coordinators=[(host, port)], name="c",
        session_timeout_ms=5000, capacity=1, tls=tls,
    )  # fmt: skip
    running = asyncio.create_task(membership.run(Hooks()))
    registered = asyncio.create_task(membership.registered.wait())
    try:
        done, _ = await asyncio.wait(
            {running, registered}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if running in done:
            error = running.exception()
            assert isinstance(error, ConsumerError), repr(error)
            return str(error)
        assert registered in done, "neither registered nor refused"
        return "registered"
    finally:
        await membership.leave({})
        for task in (running, registered):
            task.cancel()
        await asyncio.gather(running, registered, return_exceptions=True)


async def test_a_consumer_registers_over_tls(tls: TlsFiles) -> None:
    async with running_coordinator(tls=server_tls(tls).context()) as server:
        assert await outcome(server.port, client(tls)) == "registered"


async def test_mutual_tls_admits_a_certificate_and_refuses_its_absence(
    tls: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="keyshard.coordinator.server.listener")
    async with running_coordinator(tls=server_tls(tls, mutual=True).context()) as server:
        assert await outcome(server.port, client(tls, cert=True)) == "registered"
        refused = await outcome(server.port, client(tls))
        assert refused == (
            f"the coordinator at 127.0.0.1:{server.port} closed the TLS connection: it may "
            "require a client certificate (coordinator_tls.cert_file)"
        )
        # The coordinator carries on: the next consumer with a certificate gets in.
        assert await outcome(server.port, client(tls, cert=True)) == "registered"
    handshakes = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert handshakes and all("peer did not return a certificate" in m for m in handshakes)
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_client_certificate_from_another_ca_is_refused(
    tls: TlsFiles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = trustme.CA().issue_cert("stranger@example.com")
    cert, key = tmp_path / "stranger.pem", tmp_path / "stranger.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in stranger.cert_chain_pems))
    stranger.private_key_pem.write_to_path(str(key))
    caplog.set_level(logging.WARNING, logger="keyshard.coordinator.server.listener")
    async with running_coordinator(tls=server_tls(tls, mutual=True).context()) as server:
        message = await outcome(server.port, ClientTls(str(tls.ca), str(cert), str(key)))
    assert message == (
        f"the coordinator at 127.0.0.1:{server.port} closed the TLS connection: it may not "
        f"accept our client certificate (coordinator_tls.cert_file = {cert}: it must be "
        "signed by the CA of the coordinator's --tls-client-ca-file)"
    )
    assert "its certificate is not trusted by --tls-client-ca-file" in caplog.text


async def test_a_coordinator_certificate_from_another_ca_is_not_trusted(tls: TlsFiles) -> None:
    async with running_coordinator(tls=server_tls(tls).context()) as server:
        message = await outcome(server.port, client(tls, ca=tls.other_ca))
    assert message.startswith(
        f"the coordinator's certificate at 127.0.0.1:{server.port} is not trusted by "
        f"coordinator_tls.ca_file ({tls.other_ca}): "
    )


async def test_a_certificate_for_another_name_is_refused(tmp_path: Path) -> None:
    elsewhere = make_tls_files(tmp_path, hosts=("coordinator.example",))
    async with running_coordinator(tls=server_tls(elsewhere).context()) as server:
        message = await outcome(server.port, client(elsewhere))
    assert "is not valid for '127.0.0.1', the name coordinator_tls checks" in message


async def test_a_consumer_without_tls_is_told_the_coordinator_requires_it(
    tls: TlsFiles,
) -> None:
    async with running_coordinator(tls=server_tls(tls).context()) as server:
        message = await outcome(server.port, None)
    assert message == (
        f"the coordinator at 127.0.0.1:{server.port} requires TLS on its consumer channel: "
        "set coordinator_tls (ClientTls with the CA file that signed its certificate)"
    )


async def test_a_tls_consumer_is_told_the_coordinator_does_not_speak_tls(
    tls: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="keyshard.core.protocol.channel")
    async with running_coordinator() as server:
        message = await outcome(server.port, client(tls))
    assert message.startswith(
        f"the coordinator at 127.0.0.1:{server.port} does not speak TLS on its consumer "
        "channel (TLS handshake: "
    )
    assert "a TLS handshake: the peer uses TLS, this end does not" in caplog.text


async def test_a_silent_tls_connection_is_closed_at_the_deadline(tls: TlsFiles) -> None:
    limits = ConnectionLimits(register_timeout_ms=300)
    async with running_coordinator(limits, tls=server_tls(tls).context()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # closed on us
        finally:
            writer.close()
        assert server.counts.total == 0


def test_a_missing_file_is_an_error_when_the_consumer_is_made(tls: TlsFiles) -> None:
    with pytest.raises(TlsConfigError, match=r"^coordinator_tls\.ca_file: /nope\.pem does not"):
        CoordinatedConsumer(
            group="g", topics=["t"], coordinator="127.0.0.1:1", bootstrap_servers="k:1",
            coordinator_tls=ClientTls("/nope.pem"),
        )  # fmt: skip
    with pytest.raises(TlsConfigError, match=r"coordinator_tls\.key_file is set but"):
        ClientTls(str(tls.ca), key_file=str(tls.client.key)).context()
