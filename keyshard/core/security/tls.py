"""TLS contexts from PEM files, with errors that name the setting that is wrong.

`ssl` reports a bad file as `[SSL] PEM lib (_ssl.c:3900)` or `No such file or directory`
without saying which of the files it was; every caller here passes the names its user
knows (Kafka's `ssl.ca.location`, keyshard's `--tls-cert-file`, ...) so the error can say
which one to fix. Passwords are handed to OpenSSL and never appear in a message.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path


class TlsConfigError(ValueError):
    """A TLS file is missing, unreadable or not what its setting says it is."""


@dataclass(frozen=True, slots=True)
class TlsNames:
    """What the user calls each input, for error messages."""

    ca: str = "CA file"
    cert: str = "certificate file"
    key: str = "key file"
    key_password: str = "key password"


def _readable(path: str, name: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise TlsConfigError(f"{name}: {path} does not exist or is not a file")
    try:
        with p.open("rb"):
            pass
    except OSError as err:
        raise TlsConfigError(f"{name}: cannot read {path}: {err.strerror}") from None
    return str(p)


def _load_ca(context: ssl.SSLContext, ca_file: str, names: TlsNames) -> None:
    try:
        context.load_verify_locations(cafile=_readable(ca_file, names.ca))
    except ssl.SSLError:
        raise TlsConfigError(
            f"{names.ca}: {ca_file} holds no PEM certificate (expected one or more "
            "'-----BEGIN CERTIFICATE-----' blocks)"
        ) from None


def _load_chain(
    context: ssl.SSLContext, cert_file: str, key_file: str | None, password: str | None,
    names: TlsNames,
) -> None:  # fmt: skip
    cert = _readable(cert_file, names.cert)
    key = _readable(key_file, names.key) if key_file else None
    try:
        # A callable, so OpenSSL never prompts on a terminal for an encrypted key.
        context.load_cert_chain(cert, key, password=lambda: (password or "").encode())
    except ssl.SSLError as err:
        reason = err.reason or ""
        if reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(
                f"{names.key} ({key}) is not the key of {names.cert} ({cert})"
            ) from None
        # OpenSSL says only "PEM lib" for a wrong password; an encrypted key says so itself.
        if _is_encrypted(Path(key or cert)):
            given = "does not decrypt" if password else "is needed to decrypt"
            raise TlsConfigError(
                f"{names.key_password} {given} {names.key} ({key or cert})"
            ) from None
        raise TlsConfigError(
            f"{names.cert} / {names.key}: {cert} and {key or cert} are not a PEM "
            f"certificate and its private key ({reason or 'unreadable'})"
        ) from None


def _is_encrypted(key_file: Path) -> bool:
    head = key_file.read_bytes()[:4096]
    return b"ENCRYPTED PRIVATE KEY" in head or b"Proc-Type: 4,ENCRYPTED" in head


def client_context(
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    key_password: str | None = None,
    check_hostname: bool = True,
    verify: bool = True,
    names: TlsNames = TlsNames(),
) -> ssl.SSLContext:
    """A context for connecting to a TLS server: its certificate checked against
    `ca_file` (else the system's CAs), optionally presenting our own (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file:
        _load_ca(context, ca_file, names)
    if key_file and not cert_file:
        raise TlsConfigError(f"{names.key} is set but {names.cert} is not")
    if cert_file:
        _load_chain(context, cert_file, key_file, key_password, names)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = check_hostname
    return context


def server_context(
    *,
    cert_file: str,
    key_file: str | None = None,
    key_password: str | None = None,
    client_ca_file: str | None = None,
    require_client_cert: bool = False,
    names: TlsNames = TlsNames(),
) -> ssl.SSLContext:
    """A context for a TLS listener; with `client_ca_file`, clients must present a
    certificate signed by it (mutual TLS) when `require_client_cert`, or may."""
    if require_client_cert and not client_ca_file:
        raise TlsConfigError(f"requiring client certificates needs {names.ca}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(context, cert_file, key_file, key_password, names)
    if client_ca_file:
        _load_ca(context, client_ca_file, names)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


# ---- keyshard's own endpoints ------------------------------------------------------------

#: How a consumer's `coordinator_tls` settings are named in its errors.
COORDINATOR_TLS_NAMES = TlsNames(
    ca="coordinator_tls.ca_file",
    cert="coordinator_tls.cert_file",
    key="coordinator_tls.key_file",
    key_password="coordinator_tls.key_password",
)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a consumer reaches a coordinator whose channel runs TLS (`--tls-cert-file`).

    `ca_file` checks the coordinator's certificate (and the host name the consumer
    connects to); `cert_file` and `key_file` are the consumer's own certificate, for a
    coordinator that requires one (`--tls-client-ca-file`). The password of an encrypted
    key is kept out of `repr`, so a logged settings object does not show it.
    """

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def context(self, names: TlsNames = COORDINATOR_TLS_NAMES) -> ssl.SSLContext:
        return client_context(
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            key_password=self.key_password,
            names=names,
        )


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A keyshard listener's TLS files; `names` are its flags, for the errors.

    With `client_ca_file`, every client must present a certificate signed by it (mutual
    TLS): a listener that names a client CA but lets clients without a certificate in
    would only look protected.
    """

    cert_file: str
    key_file: str | None = None
    client_ca_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    names: TlsNames = TlsNames()

    def context(self) -> ssl.SSLContext:
        return server_context(
            cert_file=self.cert_file,
            key_file=self.key_file,
            key_password=self.key_password,
            client_ca_file=self.client_ca_file,
            require_client_cert=self.client_ca_file is not None,
            names=self.names,
        )

    def peer_context(self) -> ssl.SSLContext:
        """How one replica checks another's listener: the replicas of one deployment
        serve the same certificate, so a peer must present one that chains to it (the
        certificate itself is the trust anchor; the host name is a pod address no
        certificate names)."""
        context = ssl.create_default_context(cafile=self.cert_file)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.check_hostname = False
        return context
