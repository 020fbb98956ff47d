"""The replica secret: what makes a replica beat or an epoch marker believable.

Beats say where a replica is (its consumer address and admin URL); epoch markers say who
holds a state partition. Both are records in the state topic, so whoever may write to
the topic could otherwise name itself: the admin API would forward operators' requests,
bearer token included, to the URL a forged beat names, and a forged marker with a large
epoch would make the owner let go and send the consumers, with their token, to the
forger. So replicas that share a secret (`--replica-secret-file`) sign these records, and
believe only those that verify.

* The signature is HMAC-SHA256 over the record's topic, partition, key and value, in a
  record header (`keyshard-signature: <key id>:<hex>`); the topic and partition are in
  it so a signed record copied elsewhere does not verify.
* The secret file holds one or more secrets, one a line (blank lines and `#` comments
  skipped). The first signs; every one verifies. Rotating is three rolling restarts: add
  the new secret as a second line, move it first, drop the old one. A key id (the first
  8 hex digits of a hash of the secret) names the secret that signed a record, so a
  verifier never has to try them all, and a log line can say which secret is missing.
* What a signature does not stop: a topic writer can append again a record it read (a
  replayed beat keeps a replica that stopped looking alive until the replicas' Kafka
  group places its partitions elsewhere; a replayed marker is an old epoch, ignored), and
  the other records (positions, members) are not signed: keep the state topic writable
  by the coordinators' principal only (docs/operations/kafka.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SIGNATURE_HEADER = "keyshard-signature"
#: Shorter than this, a secret is refused: it could be guessed.
MIN_SECRET_CHARS = 16
_DOMAIN = b"keyshard state record v1\x00"


class SecretError(ValueError):
    """The secret file cannot be used (missing, unreadable, empty, a secret too short)."""


@dataclass(frozen=True, slots=True)
class ReplicaSecret:
    """The replica secrets: (key id, secret) pairs, the first of which signs."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def from_text(cls, text: str, where: str = "the replica secret") -> ReplicaSecret:
        secrets = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        if not secrets:
            raise SecretError(f"{where} holds no secret")
        for number, secret in enumerate(secrets, 1):
            if len(secret) < MIN_SECRET_CHARS:
                raise SecretError(
                    f"{where}: secret {number} is {len(secret)} characters, fewer than "
                    f"{MIN_SECRET_CHARS} (make one with `openssl rand -base64 32`)"
                )
        encoded = [secret.encode() for secret in secrets]
        return cls(tuple((key_id(secret), secret) for secret in encoded))

    @classmethod
    def from_file(cls, path: str, flag: str = "--replica-secret-file") -> ReplicaSecret:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SecretError(f"{flag} {path}: cannot read it: {err}") from None
        return cls.from_text(text, f"{flag} {path}")

    def sign(self, topic: str, partition: int, key: bytes, value: bytes | None) -> bytes:
        """The signature header's value for a record."""
        kid, secret = self.keys[0]
        return f"{kid}:{_mac(secret, topic, partition, key, value)}".encode()

    def headers(
        self, topic: str, partition: int, key: bytes, value: bytes | None
    ) -> list[tuple[str, bytes]]:
        return [(SIGNATURE_HEADER, self.sign(topic, partition, key, value))]

    def failure(
        self,
        topic: str,
        partition: int,
        key: bytes,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
    ) -> str | None:
        """Why a record does not verify (it is unsigned, signed by a secret not held
        here, or its signature is wrong), or None when it does."""
        signature = next((v for k, v in headers or () if k == SIGNATURE_HEADER), None)
        if signature is None:
            return "is not signed"
        kid, _, given = signature.decode("ascii", "replace").partition(":")
        secret = next((s for k, s in self.keys if k == kid), None)
        if secret is None:
            return f"is signed with key {kid[:16]!r}, which --replica-secret-file does not hold"
        if not hmac.compare_digest(given, _mac(secret, topic, partition, key, value)):
            return f"has a wrong signature (key {kid})"
        return None


def key_id(secret: bytes) -> str:
    """A secret's public name: a hash prefix, nothing it could be recovered from."""
    return hashlib.sha256(b"keyshard key id\x00" + secret).hexdigest()[:8]


def _mac(secret: bytes, topic: str, partition: int, key: bytes, value: bytes | None) -> str:
    message = b"".join(
        (
            _DOMAIN,
            _field(topic.encode()),
            partition.to_bytes(4, "big", signed=True),
            _field(key),
            _field(value or b""),
        )
    )
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _field(data: bytes) -> bytes:
    """Length-prefixed, so no two (topic, key, value) triples sign the same bytes."""
    return len(data).to_bytes(4, "big") + data
