"""Why a Kafka client cannot connect, in one line that names the setting to fix.

aiokafka reports every failed bootstrap as `Unable to bootstrap from [...]`, whether the
broker is down, the password is wrong or the CA does not match; the real cause is only
logged. `explain_failure` opens one connection per bootstrap address with the same
settings and turns what went wrong into a sentence a user can act on: the setting's
name, never its secret value. Callers use it on their failure path only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.addresses import parse_host_port


class KafkaUnreachable(ConnectionError):
    """Kafka could not be used with these settings; the message says which to check.
    `lasting`: retrying with the same settings cannot help (credentials, TLS, protocol)."""

    def __init__(self, message: str, *, lasting: bool) -> None:
        super().__init__(message)
        self.lasting = lasting


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why one bootstrap address failed; `lasting` as in KafkaUnreachable."""

    address: str
    sentence: str
    lasting: bool


def _diagnose(err: BaseException, settings: KafkaSettings, address: str) -> Diagnosis:
    user, _ = settings.credentials()
    mechanism = settings.sasl_mechanism
    if isinstance(err, SaslAuthenticationFailed):
        who = f"sasl.username={user!r}" if user else "the OAUTHBEARER token"
        return Diagnosis(
            address,
            f"Kafka at {address} refused the SASL {mechanism} credentials ({who}): "
            "check sasl.username and sasl.password (or the token provider)",
            lasting=True,
        )
    if isinstance(err, UnsupportedSaslMechanismError | IllegalSaslStateError):
        return Diagnosis(
            address,
            f"Kafka at {address} does not accept sasl.mechanism={mechanism} on this listener: "
            "check sasl.mechanism and security.protocol against the broker's listener",
            lasting=True,
        )
    if isinstance(err, ssl.SSLCertVerificationError):
        return Diagnosis(
            address,
            f"the TLS certificate of Kafka at {address} is not trusted "
            f"({err.verify_message}): check ssl.ca.location",
            lasting=True,
        )
    if isinstance(err, KafkaConnectionError | ConnectionResetError | ssl.SSLEOFError):
        return Diagnosis(
            address,
            f"Kafka at {address} closed the connection during the handshake: does the "
            f"listener speak security.protocol={settings.security_protocol}?",
            lasting=True,
        )
    if isinstance(err, ssl.SSLError):
        return Diagnosis(
            address,
            f"TLS with Kafka at {address} failed ({err.reason or err}): does the listener "
            "speak TLS (security.protocol), and does it want a client certificate "
            "(ssl.certificate.location / ssl.key.location)?",
            lasting=True,
        )
    if isinstance(err, TimeoutError):
        return Diagnosis(
            address,
            f"no answer from Kafka at {address} in time: is security.protocol "
            f"({settings.security_protocol}) the listener's?",
            lasting=False,
        )
    if isinstance(err, OSError):
        reason = err.strerror or str(err) or type(err).__name__
        return Diagnosis(address, f"cannot reach Kafka at {address}: {reason}", lasting=False)
    return Diagnosis(
        address, f"cannot use Kafka at {address}: {type(err).__name__}: {err}", lasting=False
    )


def is_passing(err: BaseException) -> bool:
    """Whether the same request may well succeed soon: a timeout, a connection refused or
    reset, or an error Kafka marks retriable (NOT_COORDINATOR, a coordinator still
    loading, ...). A TLS failure is not: the same handshake fails the same way."""
    if isinstance(err, ssl.SSLError):
        return False
    return isinstance(err, TimeoutError | OSError) or bool(getattr(err, "retriable", False))


async def diagnose(
    bootstrap_servers: str, settings: KafkaSettings, timeout: float = 10.0
) -> list[Diagnosis]:
    """One connection attempt per bootstrap address with `settings`: what failed, each
    as a sentence; empty if every address works now."""
    options: dict[str, Any] = {
        k: v
        for k, v in settings.client_options().items()
        if k in ("ssl_context", "security_protocol", "sasl_mechanism", "sasl_plain_username",
                 "sasl_plain_password", "sasl_oauth_token_provider", "client_id")
    }  # fmt: skip
    problems = []
    for address in bootstrap_servers.split(","):
        address = address.strip()
        try:
            host, port = parse_host_port(address)
        except ValueError as err:
            problems.append(Diagnosis(address, f"bootstrap server {err}", lasting=True))
            continue
        try:
            conn = await asyncio.wait_for(
                create_conn(host, port, request_timeout_ms=int(timeout * 1000), **options),
                timeout,
            )
        except (KafkaError, OSError, TimeoutError) as err:
            problems.append(_diagnose(err, settings, address))
        else:
            conn.close()
    return problems


class _Dropping(logging.Filter):
    def __init__(self, containing: str) -> None:
        super().__init__()
        self.containing = containing

    def filter(self, record: logging.LogRecord) -> bool:
        return self.containing not in str(record.msg)


@contextlib.contextmanager
def quiet_aiokafka(logger_name: str, containing: str) -> Iterator[None]:
    """Drops an aiokafka log message while we explain the same failure in one line of our
    own: the cause logged first as a bare ERROR (with the setting to fix unnamed) only
    confuses."""
    quiet = _Dropping(containing)
    logger = logging.getLogger(logger_name)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def quiet_bootstrap() -> contextlib.AbstractContextManager[None]:
    """Without aiokafka's per-address 'Unable connect to ...' while a client starts: a
    failure is explained by `start_client`."""
    return quiet_aiokafka("aiokafka", "Unable connect to")


async def start_client(
    client: Any, bootstrap_servers: str, settings: KafkaSettings, what: str, timeout: float
) -> None:
    """`await client.start()` (any aiokafka client), bounded by `timeout`; on failure a
    KafkaUnreachable saying why, in words naming the setting to check (the client is
    stopped first)."""
    try:
        with quiet_bootstrap():
            await asyncio.wait_for(client.start(), timeout)
        return
    except (KafkaError, OSError, TimeoutError) as err:
        failure: BaseException = err
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.stop(), timeout)
    raise await unreachable(failure, bootstrap_servers, settings, what, timeout) from failure


async def unreachable(
    failure: BaseException, bootstrap_servers: str, settings: KafkaSettings, what: str,
    timeout: float,
) -> KafkaUnreachable:  # fmt: skip
    """The KafkaUnreachable to raise for `failure` of `what`: the diagnosis of every
    bootstrap address, or the failure itself when connecting works now."""
    found = await diagnose(bootstrap_servers, settings, timeout)
    if not found:
        return KafkaUnreachable(f"{what}: {failure!r}", lasting=False)
    sentences = "; ".join(d.sentence for d in found)
    return KafkaUnreachable(f"{what}: {sentences}", lasting=all(d.lasting for d in found))
