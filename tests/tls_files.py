"""Certificates for tests: a CA and leaf certificates from `trustme`, written as PEM files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


@dataclass(frozen=True)
class LeafFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server: LeafFiles
    client: LeafFiles
    other_ca: Path  # a CA that signed none of the above

    def encrypted_client_key(self, password: str) -> Path:
        key = serialization.load_pem_private_key(self.client.key.read_bytes(), None)
        path = self.client.key.with_name("client-encrypted.key")
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(password.encode()),
            )
        )
        return path


def make_tls_files(
    directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    other = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))

    def leaf(name: str, *identities: str) -> LeafFiles:
        issued = ca.issue_cert(*identities)
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(key))
        return LeafFiles(cert, key)

    return TlsFiles(
        ca=directory / "ca.pem",
        server=leaf("server", *hosts),
        client=leaf("client", "keyshard-client@example.com"),
        other_ca=directory / "other-ca.pem",
    )
