"""TLS on keyshard's own endpoints, with a real coordinator process.

The consumer channel with mutual TLS: a consumer with a client certificate registers and
processes; one without a certificate, one trusting another CA and one without TLS each
fail with a `ConsumerError` naming the setting to fix, while the first keeps processing
and the coordinator logs one line per refused handshake. The admin API over HTTPS answers
with the CA and refuses without it. Bad certificate files stop the daemon at start with
one line naming the flag.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import subprocess
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from harness import CoordinatorProcess, create_topic, produce, wait_for
from keyshard.consumer_client import ClientTls, ConsumerError, CoordinatedConsumer
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.processes import free_port
from tests.deploy.dockerfile import parse_dockerfile
from tests.tls_files import TlsFiles, make_tls_files

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KEY_PASSWORD = "pem-pass-5c1e"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def encrypted_server_key(tls: TlsFiles, password: str) -> Path:
    key = serialization.load_pem_private_key(tls.server.key.read_bytes(), None)
    path = tls.server.key.with_name("server-encrypted.key")
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return path


@dataclass
class HttpsCoordinator(CoordinatorProcess):
    """The harness's coordinator with its admin API over HTTPS, checked against `ca`."""

    ca: Path | None = None

    @property
    def admin_url(self) -> str:
        return f"https://127.0.0.1:{self.admin_port}"

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def client(self, timeout: float = 5) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout, verify=self.verify())


async def _refusal(consumer: CoordinatedConsumer) -> str:
    """Run a consumer that must be refused; the ConsumerError's message."""
    with pytest.raises(ConsumerError) as refused:
        await asyncio.wait_for(consumer.run(lambda record: asyncio.sleep(0)), 30)
    return str(refused.value)


async def test_mutual_tls_admits_a_certificate_and_refuses_the_rest_clearly(
    broker: EmbeddedBroker, tls: TlsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, group = f"tls-{uuid.uuid4().hex[:8]}", f"tls-group-{uuid.uuid4().hex[:6]}"
    await create_topic(broker.bootstrap_servers, topic)
    monkeypatch.setenv("KEYSHARD_TLS_KEY_PASSWORD", KEY_PASSWORD)  # the child inherits it
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers,
        tmp_path,
        extra=[
            "--tls-cert-file", str(tls.server.cert),
            "--tls-key-file", str(encrypted_server_key(tls, KEY_PASSWORD)),
            "--tls-client-ca-file", str(tls.ca),
        ],
    )  # fmt: skip
    with_cert = ClientTls(str(tls.ca), str(tls.client.cert), str(tls.client.key))

    def consumer(name: str, coordinator_tls: ClientTls | None) -> CoordinatedConsumer:
        return CoordinatedConsumer(
            group=group, topics=[topic], coordinator=coordinator.address,
            bootstrap_servers=broker.bootstrap_servers, name=name, session_timeout_ms=6000,
            coordinator_tls=coordinator_tls,
        )  # fmt: skip

    received: set[int] = set()

    async def handle(record: Any) -> None:
        received.add(record.offset)

    member = consumer("with-cert", with_cert)
    running: asyncio.Task[None] | None = None
    try:
        await coordinator.start()
        running = asyncio.create_task(member.run(handle))
        await member.wait_registered(15)
        first = await produce(broker.bootstrap_servers, 200, 20, topic=topic)
        await wait_for(lambda: len(received) >= len(first), 20, "the first 200 records")

        refusals = {
            "no certificate": await _refusal(consumer("no-cert", ClientTls(str(tls.ca)))),
            "another CA": await _refusal(
                consumer("other-ca", replace(with_cert, ca_file=str(tls.other_ca)))
            ),
            "no TLS": await _refusal(consumer("plain", None)),
        }
        address = coordinator.address
        assert refusals["no certificate"] == (
            f"the coordinator at {address} closed the TLS connection: it may require a "
            "client certificate (coordinator_tls.cert_file)"
        )
        assert refusals["another CA"].startswith(
            f"the coordinator's certificate at {address} is not trusted by "
            f"coordinator_tls.ca_file ({tls.other_ca})"
        )
        assert refusals["no TLS"].startswith(
            f"the coordinator at {address} requires TLS on its consumer channel"
        )

        # The member with a certificate never noticed.
        more = await produce(broker.bootstrap_servers, 200, 20, topic=topic, start=200)
        await wait_for(lambda: len(received) >= len(first) + len(more), 20, "200 more")
        view = await coordinator.group(group)
        assert view is not None and [m["member_id"] for m in view["members"]] == [member.member_id]
    finally:
        if running is not None:
            await member.close()
            await asyncio.wait_for(running, 30)
        coordinator.stop()
    log = coordinator.read_log()
    assert "listening on" in log and "(TLS)" in log
    # One line per refused handshake (two tries without a certificate, the client that
    # does not trust us, the plain-text one), at most 3 per 10 s and then a count.
    lines = [line for line in log.splitlines() if "keyshard.coordinator.server.listener" in line]
    shown = [line for line in lines if " more " not in line]
    counted = sum(int(n) for n in re.findall(r"\.\.\. and (\d+) more TLS handshakes", log))
    assert len(shown) + counted == 4, lines
    assert "peer did not return a certificate" in shown[0], shown
    assert "Traceback" not in log
    assert KEY_PASSWORD not in log


async def test_admin_api_over_https(broker: EmbeddedBroker, tls: TlsFiles, tmp_path: Path) -> None:
    coordinator = HttpsCoordinator(
        broker.bootstrap_servers,
        tmp_path,
        extra=[
            "--admin-tls-cert-file", str(tls.server.cert),
            "--admin-tls-key-file", str(tls.server.key),
        ],
        ca=tls.ca,
    )  # fmt: skip
    try:
        await coordinator.start()  # waits for https /readyz checked against the CA
        async with httpx.AsyncClient(timeout=5, verify=coordinator.verify()) as client:
            assert (await client.get(f"{coordinator.admin_url}/v1/groups")).status_code == 200
        # Without our CA, the certificate is refused; plain HTTP gets no answer.
        async with httpx.AsyncClient(timeout=5) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"{coordinator.admin_url}/healthz")
            with pytest.raises(httpx.HTTPError):
                await client.get(f"http://127.0.0.1:{coordinator.admin_port}/healthz")
        # The CLI trusts the CA through SSL_CERT_FILE; the image's HEALTHCHECK asks HTTPS.
        cli = subprocess.run(
            [sys.executable, "-m", "keyshard", "groups", "--admin", coordinator.admin_url],
            env={**os.environ, "SSL_CERT_FILE": str(tls.ca)},
            cwd=REPO, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        healthcheck = parse_dockerfile(REPO / "Dockerfile").healthcheck
        probe = subprocess.run(
            [sys.executable, *healthcheck[1:]],
            env={
                "KEYSHARD_ADMIN_LISTEN": f"0.0.0.0:{coordinator.admin_port}",
                "KEYSHARD_ADMIN_TLS_CERT_FILE": str(tls.server.cert),
            },
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert probe.returncode == 0, probe.stderr
        assert "admin https://" in coordinator.read_log()
    finally:
        coordinator.stop()


# ---- bad files: one line naming the flag, exit status 2 -----------------------------------


def _start_with(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`keyshard coordinator` with these flags and no broker: the TLS check comes first."""
    return subprocess.run(
        [
            sys.executable, "-m", "keyshard", "coordinator",
            "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}",
            *flags,
        ],
        env={**os.environ, **(env or {})}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_bad_tls_files_stop_the_daemon_with_one_line_naming_the_flag(
    tls: TlsFiles, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    encrypted = encrypted_server_key(tls, KEY_PASSWORD)
    server = ("--tls-cert-file", str(tls.server.cert), "--tls-key-file")
    cases: list[tuple[tuple[str, ...], dict[str, str], str]] = [
        (("--tls-cert-file", "/nope.pem"), {}, "--tls-cert-file: /nope.pem does not exist"),
        ((*server, str(tls.client.key)), {}, "--tls-key-file"),
        ((*server, str(encrypted)), {"KEYSHARD_TLS_KEY_PASSWORD": "wrong-pass-77"},
         "KEYSHARD_TLS_KEY_PASSWORD does not decrypt --tls-key-file"),
        ((*server, str(encrypted)), {}, "KEYSHARD_TLS_KEY_PASSWORD is needed to decrypt"),
        ((*server, str(tls.server.key), "--tls-client-ca-file", str(junk)), {},
         f"--tls-client-ca-file: {junk} holds no PEM certificate"),
        (("--tls-client-ca-file", str(tls.ca)), {}, "--tls-client-ca-file needs --tls-cert-file"),
        (("--admin-tls-cert-file", str(junk)), {}, "--admin-tls-cert-file / --admin-tls-key-file"),
    ]  # fmt: skip
    for flags, env, expected in cases:
        result = _start_with(*flags, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (flags, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("keyshard coordinator: "), result.stderr
        assert expected in lines[0], (expected, lines[0])
        assert "wrong-pass-77" not in result.stderr
    mismatch = _start_with(*server, str(tls.client.key)).stderr
    assert f"is not the key of --tls-cert-file ({tls.server.cert})" in mismatch
