"""Kafka client settings: Kafka's names in, aiokafka's arguments out, secrets never shown."""

from __future__ import annotations

import ssl
import sys
import types
from pathlib import Path

import pytest
from aiokafka.abc import AbstractTokenProvider
from hypothesis import given
from hypothesis import strategies as st

from keyshard.core.kafka.settings import (
    KafkaConfigError,
    KafkaSettings,
    from_environment,
    load_properties,
    parse_properties,
)
from tests.tls_files import TlsFiles, make_tls_files

SECRET = "s3cr3t-Pa55"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


class Tokens(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped (Any)
    async def token(self) -> str:
        return "a-token"


def refused(props: dict[str, str], match: str, **kwargs: object) -> KafkaConfigError:
    with pytest.raises(KafkaConfigError, match=match) as caught:
        KafkaSettings.parse(props, **kwargs)
    assert SECRET not in str(caught.value)
    return caught.value


def test_nothing_given_is_plaintext_reading_committed_data() -> None:
    settings = KafkaSettings.parse()
    assert settings.client_options() == {"security_protocol": "PLAINTEXT"}
    assert settings.consumer_options()["isolation_level"] == "read_committed"


def test_sasl_ssl_scram_maps_to_aiokafka(tls: TlsFiles) -> None:
    settings = KafkaSettings.parse(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "keyshard",
            "sasl.password": SECRET,
            "ssl.ca.location": str(tls.ca),
            "client.id": "orders-worker",
            "request.timeout.ms": "15000",
        }
    )
    options = settings.client_options()
    assert isinstance(options.pop("ssl_context"), ssl.SSLContext)
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "keyshard",
        "sasl_plain_password": SECRET,
        "client_id": "orders-worker",
        "request_timeout_ms": 15000,
    }
    assert SECRET not in repr(settings) and SECRET not in str(settings.redacted())
    assert settings.redacted()["sasl.password"] == "[hidden]"


@pytest.mark.parametrize(
    ("module", "quote"),
    [("org.apache.kafka.common.security.plain.PlainLoginModule", '"'),
     ("org.apache.kafka.common.security.scram.ScramLoginModule", "'")],
)  # fmt: skip
def test_java_jaas_line_gives_the_credentials(module: str, quote: str) -> None:
    jaas = f"{module} required username={quote}app{quote} password={quote}{SECRET}{quote};"
    settings = KafkaSettings.parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.jaas.config": jaas,
        }
    )
    options = settings.client_options()
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("app", SECRET)
    assert SECRET not in repr(settings)


def test_oauthbearer_takes_a_token_provider() -> None:
    provider = Tokens()
    settings = KafkaSettings.parse(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"},
        token_provider=provider,
    )
    assert settings.client_options()["sasl_oauth_token_provider"] is provider


def test_oauthbearer_token_provider_from_a_module_path(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("my_tokens")
    module.Tokens = Tokens  # type: ignore[attr-defined]
    module.not_a_provider = object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_tokens", module)
    base = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}
    settings = KafkaSettings.parse({**base, "sasl.oauthbearer.token.provider": "my_tokens:Tokens"})
    assert isinstance(settings.client_options()["sasl_oauth_token_provider"], Tokens)
    refused(
        {**base, "sasl.oauthbearer.token.provider": "my_tokens:not_a_provider"},
        "is a object, not an aiokafka AbstractTokenProvider",
    )
    refused({**base, "sasl.oauthbearer.token.provider": "my_tokens:nope"}, "cannot load it")
    refused({**base, "sasl.oauthbearer.token.provider": "my_tokens"}, "expected module:attribute")


def test_mutual_tls_with_an_encrypted_key(tls: TlsFiles) -> None:
    key = tls.encrypted_client_key(SECRET)
    props = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls.ca),
        "ssl.certificate.location": str(tls.client.cert),
        "ssl.key.location": str(key),
        "ssl.key.password": SECRET,
    }
    assert isinstance(KafkaSettings.parse(props).client_options()["ssl_context"], ssl.SSLContext)
    refused({**props, "ssl.key.password": "wrong"}, "ssl.key.password does not decrypt")
    refused(
        {**props, "ssl.key.location": str(tls.server.key), "ssl.key.password": ""},
        r"ssl.key.location \(.*server.key\) is not the key of ssl.certificate.location",
    )


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"group.id": "g"}, "group.id cannot be set here: the group is keyshard's"),
        ({"ssl.truststore.location": "/x.jks"}, "JKS stores are Java-only"),
        ({"fetch.min.bytes": "1"}, "unknown Kafka setting 'fetch.min.bytes'; keyshard accepts: "),
        ({"security.protocol": "TLS"}, "security.protocol='TLS': expected one of"),
        (
            {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": SECRET},
            r"sasl.mechanism, sasl.password, sasl.username given, but security.protocol="
            r"PLAINTEXT uses no SASL",
        ),
        ({"ssl.ca.location": "/ca.pem"}, "security.protocol=PLAINTEXT uses no TLS"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "needs sasl.mechanism"),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"},
            "sasl.mechanism=GSSAPI: keyshard supports PLAIN, SCRAM-SHA-256",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
             "sasl.password": SECRET},
            "sasl.mechanism=PLAIN needs sasl.username$",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"},
            "OAUTHBEARER needs a token provider",
        ),
        ({"isolation.level": "committed"}, "isolation.level='committed': expected one of"),
        ({"request.timeout.ms": "10s"}, r"request.timeout.ms='10s': expected a whole number"),
        (
            {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
            "ssl.ca.location: /nonexistent/ca.pem does not exist",
        ),
        (
            {"security.protocol": "SSL", "ssl.key.location": "/k.pem"},
            "ssl.key.location is set but ssl.certificate.location is not",
        ),
        (
            {"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"},
            "enable.ssl.certificate.verification='maybe': expected true or false",
        ),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_a_message_naming_them(
    props: dict[str, str], message: str
) -> None:
    refused(props, message)


def test_a_file_that_is_not_pem_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate")
    refused({"security.protocol": "SSL", "ssl.ca.location": str(junk)}, "holds no PEM certificate")


def test_a_secret_given_twice_differently_is_not_shown() -> None:
    with pytest.raises(KafkaConfigError, match="given twice") as caught:
        KafkaSettings.parse({"sasl.password": "one", " sasl.password": SECRET})
    assert SECRET not in str(caught.value)


def test_bootstrap_servers_from_either_place_but_not_two_different_ones() -> None:
    settings = KafkaSettings.parse({"bootstrap.servers": "k1:9092"})
    assert settings.with_bootstrap(None) == "k1:9092"
    assert settings.with_bootstrap("k1:9092") == "k1:9092"
    with pytest.raises(KafkaConfigError, match="given twice, differently"):
        settings.with_bootstrap("k2:9092")
    with pytest.raises(KafkaConfigError, match="no bootstrap servers"):
        KafkaSettings.parse().with_bootstrap(None)


def test_properties_file_in_javas_format(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# Confluent Cloud style\n"
        "! another comment\n"
        "bootstrap.servers=pkc-1.example.com:9092\n"
        "security.protocol : SASL_SSL\n"
        "sasl.mechanism SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="app" \\\n'
        '    password="p=a:s\\\\s";\n'
        "client.id = with spaces \\t tab\n"
        "\n"
    )
    props = load_properties(path)
    assert props["bootstrap.servers"] == "pkc-1.example.com:9092"
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-256"
    assert props["client.id"] == "with spaces \t tab"
    assert props["sasl.jaas.config"].endswith('username="app" password="p=a:s\\s";')
    with pytest.raises(KafkaConfigError, match="cannot read Kafka config"):
        load_properties(tmp_path / "missing.properties")


_names = st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,3}", fullmatch=True)
_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=30)


@given(st.dictionaries(_names, _values.map(str.strip), max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\")

    lines = [f"{name}={escape(value)}" for name, value in props.items()]
    assert parse_properties(lines) == props


def test_environment_variables_map_to_kafka_names() -> None:
    environ = {
        "KEYSHARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KEYSHARD_KAFKA_SASL_PASSWORD": SECRET,
        "KEYSHARD_KAFKA_CONFIG": "/etc/keyshard/kafka.properties",  # the flag's own variable
        "KEYSHARD_LISTEN": "0.0.0.0:7171",
    }
    assert from_environment(environ) == {
        "security.protocol": "SASL_SSL",
        "sasl.password": SECRET,
    }


def test_an_encrypted_key_without_its_password_says_so(tls: TlsFiles) -> None:
    key = tls.encrypted_client_key(SECRET)
    refused(
        {"security.protocol": "SSL", "ssl.certificate.location": str(tls.client.cert),
         "ssl.key.location": str(key)},
        "ssl.key.password is needed to decrypt ssl.key.location",
    )  # fmt: skip
