"""TLS contexts: a real handshake over loopback, and errors that name the setting."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from keyshard.core.security.tls import TlsConfigError, TlsNames, client_context, server_context
from tests.tls_files import TlsFiles, make_tls_files

NAMES = TlsNames(ca="--tls-ca-file", cert="--tls-cert-file", key="--tls-key-file")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """Connect over loopback; the server's view of the client's certificate subject."""
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert")
        seen.set_result(str(peer.get("subjectAltName", "")) if peer else "")
        writer.close()

    srv = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        writer.close()
        return await asyncio.wait_for(seen, 5)
    finally:
        srv.close()


async def test_mutual_tls_handshake(tls: TlsFiles) -> None:
    server = server_context(
        cert_file=str(tls.server.cert), key_file=str(tls.server.key),
        client_ca_file=str(tls.ca), require_client_cert=True,
    )  # fmt: skip
    client = client_context(
        ca_file=str(tls.ca), cert_file=str(tls.client.cert), key_file=str(tls.client.key)
    )
    assert "keyshard-client@example.com" in await handshake(server, client)


async def test_a_client_without_a_certificate_is_refused_when_one_is_required(
    tls: TlsFiles,
) -> None:
    server = server_context(
        cert_file=str(tls.server.cert), key_file=str(tls.server.key),
        client_ca_file=str(tls.ca), require_client_cert=True,
    )  # fmt: skip
    accepted: list[object] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer.get_extra_info("peercert"))
        writer.close()

    srv = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    try:
        # TLS 1.3: the client's side of the handshake ends before the server checks it,
        # so the refusal arrives later, as the end of the stream (or an alert).
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(ca_file=str(tls.ca))
        )
        writer.write(b"hello")
        try:
            assert await asyncio.wait_for(reader.read(1), 5) == b""
        except ssl.SSLError as err:
            assert "CERTIFICATE_REQUIRED" in str(err)
        writer.close()
    finally:
        srv.close()
    assert accepted == []


async def test_a_client_trusting_another_ca_refuses_the_server(tls: TlsFiles) -> None:
    server = server_context(cert_file=str(tls.server.cert), key_file=str(tls.server.key))
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(server, client_context(ca_file=str(tls.other_ca)))


def test_errors_name_the_flag(tls: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match=r"^--tls-cert-file: /nope\.pem does not exist"):
        server_context(cert_file="/nope.pem", names=NAMES)
    with pytest.raises(TlsConfigError, match="requiring client certificates needs --tls-ca-file"):
        server_context(cert_file=str(tls.server.cert), require_client_cert=True, names=NAMES)
    junk = tmp_path / "junk.pem"
    junk.write_text("junk")
    with pytest.raises(TlsConfigError, match=r"--tls-ca-file: .*junk\.pem holds no PEM"):
        client_context(ca_file=str(junk), names=NAMES)
    with pytest.raises(TlsConfigError, match="are not a PEM certificate and its private key"):
        server_context(cert_file=str(junk), names=NAMES)
