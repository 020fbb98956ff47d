"""A client that cannot use Kafka is told which setting to fix: a real SASL_SSL broker."""

from __future__ import annotations

import pytest

from keyshard.core.kafka.connect import diagnose
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.local.processes import free_port
from tests.conftest import SecuredKafka

pytestmark = pytest.mark.integration


async def explain_failure(address: str, settings: KafkaSettings) -> str:
    return "; ".join(d.sentence for d in await diagnose(address, settings, timeout=5))


async def explain(secured: SecuredKafka, address: str, **props: str) -> str:
    settings = KafkaSettings.parse({**secured.client_config(), **props})
    message = await explain_failure(address, settings)
    assert secured.users["app"] not in message
    return message


async def test_good_settings_explain_nothing(secured_kafka: SecuredKafka) -> None:
    assert await explain(secured_kafka, secured_kafka.address) == ""


@pytest.mark.parametrize(
    ("props", "on_plaintext", "expected"),
    [
        ({"sasl.password": "wrong"}, False,
         "refused the SASL SCRAM-SHA-512 credentials (sasl.username='app'): check sasl.username "
         "and sasl.password"),
        ({"sasl.mechanism": "SCRAM-SHA-256"}, False,
         "does not accept sasl.mechanism=SCRAM-SHA-256 on this listener"),
        ({"ssl.ca.location": "OTHER_CA"}, False, "is not trusted (unable to get local issuer "
         "certificate): check ssl.ca.location"),
        ({}, True, "closed the connection during the handshake: does the listener speak "
         "security.protocol=SASL_SSL?"),
    ],
)  # fmt: skip
async def test_each_mistake_names_its_setting(
    secured_kafka: SecuredKafka, props: dict[str, str], on_plaintext: bool, expected: str
) -> None:
    if props.get("ssl.ca.location") == "OTHER_CA":
        props = {**props, "ssl.ca.location": str(secured_kafka.tls.other_ca)}
    address = secured_kafka.broker.bootstrap_servers if on_plaintext else secured_kafka.address
    assert expected in await explain(secured_kafka, address, **props)


async def test_plaintext_client_on_the_tls_listener(secured_kafka: SecuredKafka) -> None:
    message = await explain_failure(secured_kafka.address, KafkaSettings.parse())
    assert "security.protocol=PLAINTEXT?" in message


async def test_nothing_listening() -> None:
    port = free_port()
    message = await explain_failure(f"127.0.0.1:{port}", KafkaSettings.parse())
    assert message.startswith(f"cannot reach Kafka at 127.0.0.1:{port}")
