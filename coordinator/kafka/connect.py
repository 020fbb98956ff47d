"""Why a Kafka client cannot connect, in one line that names the setting to fix.

aiokafka reports every failed bootstrap as `Unable to bootstrap from [...]`, whether the
broker is down, the password is wrong or the CA does not match; the real cause is only
logged. `explain_failure` opens one connection per bootstrap address with the same
settings and turns what went wrong into a sentence a user can act on: the setting's
name, never its secret value. Callers use it on their failure path only.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from coordinator.kafka.settings import KafkaSettings
from coordinator.model.addresses import parse_host_port


class KafkaUnreachable(ConnectionError):
    """Kafka could not be used with these settings; the message says which to check."""


def _sentence(err: BaseException, settings: KafkaSettings, address: str) -> str:
    user, _ = settings.credentials()
    mechanism = settings.sasl_mechanism
    if isinstance(err, SaslAuthenticationFailed):
        who = f"sasl.username={user!r}" if user else "the OAUTHBEARER token"
        return (
            f"Kafka at {address} refused the SASL {mechanism} credentials ({who}): "
            "check sasl.username and sasl.password (or the token provider)"
        )
    if isinstance(err, UnsupportedSaslMechanismError | IllegalSaslStateError):
        return (
            f"Kafka at {address} does not accept sasl.mechanism={mechanism} on this listener: "
            "check sasl.mechanism and security.protocol against the broker's listener"
        )
    if isinstance(err, ssl.SSLCertVerificationError):
        return (
            f"the TLS certificate of Kafka at {address} is not trusted "
            f"({err.verify_message}): check ssl.ca.location"
        )
    if isinstance(err, ssl.SSLError):
        return (
            f"TLS with Kafka at {address} failed ({err.reason or err}): does the listener "
            "speak TLS (security.protocol), and does it want a client certificate "
            "(ssl.certificate.location / ssl.key.location)?"
        )
    if isinstance(err, KafkaConnectionError | ConnectionResetError | ssl.SSLEOFError):
        return (
            f"Kafka at {address} closed the connection during the handshake: does the "
            f"listener speak security.protocol={settings.security_protocol}?"
        )
    if isinstance(err, TimeoutError):
        return (
            f"no answer from Kafka at {address} in time: is security.protocol "
            f"({settings.security_protocol}) the listener's?"
        )
    if isinstance(err, OSError):
        return f"cannot reach Kafka at {address}: {err.strerror or err or type(err).__name__}"
    return f"cannot use Kafka at {address}: {type(err).__name__}: {err}"


async def explain_failure(
    bootstrap_servers: str, settings: KafkaSettings, timeout: float = 10.0
) -> str:
    """One line per bootstrap address that failed, joined; '' if every address works now
    (the failure was passing, or lies beyond connecting: the caller's own error stands)."""
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
            problems.append(str(err))
            continue
        try:
            conn = await asyncio.wait_for(
                create_conn(host, port, request_timeout_ms=int(timeout * 1000), **options),
                timeout,
            )
        except (KafkaError, OSError, TimeoutError) as err:
            problems.append(_sentence(err, settings, address))
        else:
            conn.close()
    return "; ".join(problems)
