"""Kafka client settings, in Kafka's own property names, mapped to aiokafka once.

Users paste what they already have for their cluster (`security.protocol=SASL_SSL`,
`sasl.mechanism=SCRAM-SHA-512`, `sasl.username`, `sasl.password`, `ssl.ca.location`,
...: librdkafka's names, which confluent-kafka and most tools share; Java's
`sasl.jaas.config` line is understood too). Every entry point goes through
`KafkaSettings`: `CoordinatedConsumer(kafka_config=...)`, the coordinator's
`--kafka-config FILE` and `KEYSHARD_KAFKA_*` variables, the Spark source's `kafka.`
options and the executor job. Unknown and contradictory settings are refused with a
message naming them, files are checked when the settings are made (not at the first
connection, minutes later), and secret values never appear in a message or a repr.
"""

from __future__ import annotations

import importlib
import re
import ssl
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.abc import AbstractTokenProvider

from keyshard.core.security.tls import TlsConfigError, TlsNames, client_context

__all__ = [
    "ISOLATION_LEVELS",
    "KafkaConfigError",
    "KafkaSettings",
    "from_environment",
    "load_properties",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
SECRETS = frozenset({"sasl.password", "ssl.key.password", "sasl.jaas.config"})
REDACTED = "[hidden]"

#: Accepted names and what they do (the error for an unknown name lists these).
ACCEPTED: Mapping[str, str] = {
    "bootstrap.servers": "host:port[,host:port...] of the cluster",
    "security.protocol": " | ".join(PROTOCOLS),
    "sasl.mechanism": " | ".join(MECHANISMS),
    "sasl.username": "user for PLAIN / SCRAM",
    "sasl.password": "password for PLAIN / SCRAM (secret)",
    "sasl.jaas.config": "Java's login line, for its username and password (secret)",
    "sasl.oauthbearer.token.provider": "module:attribute of an aiokafka AbstractTokenProvider "
    "(an instance, or a class / function returning one) for OAUTHBEARER",
    "ssl.ca.location": "PEM file of the CA(s) the brokers' certificates are checked against",
    "ssl.certificate.location": "PEM file of our client certificate (mutual TLS)",
    "ssl.key.location": "PEM file of its private key",
    "ssl.key.password": "password of that key (secret)",
    "ssl.endpoint.identification.algorithm": "https (check the broker's host name) | none",
    "enable.ssl.certificate.verification": "true | false (false: trust any broker certificate)",
    "client.id": "client id the brokers log and quota by",
    "isolation.level": " | ".join(ISOLATION_LEVELS) + " (consumers; default read_committed)",
    "fetch.max.bytes": "most bytes a fetch response carries (consumers; default: a quarter "
    "of the consumer's max_buffer_bytes)",
    "max.partition.fetch.bytes": "most bytes per partition in a fetch response (consumers; "
    "default: max_buffer_bytes / 16, at most 1 MiB)",
    "request.timeout.ms": "how long a request may wait for its answer",
    "metadata.max.age.ms": "metadata refresh interval",
    "retry.backoff.ms": "wait before a retry",
    "connections.max.idle.ms": "close idle connections after this",
    "client.dns.lookup": "accepted for compatibility (aiokafka tries every address a name has)",
}
#: librdkafka spellings of the same settings.
ALIASES = {"sasl.mechanisms": "sasl.mechanism", "ssl.ca.pem.location": "ssl.ca.location"}
#: Real Kafka settings that keyshard sets itself: a clear refusal, not "unknown".
MANAGED = {
    "group.id": "the group is keyshard's (group= / --group)",
    "enable.auto.commit": "keyshard stores positions itself",
    "auto.offset.reset": "a range starts at the positions the coordinator hands over",
    "session.timeout.ms": "the coordinator session is session_timeout_ms / --session-timeout-ms",
    "heartbeat.interval.ms": "the coordinator pings its members",
    "key.deserializer": "records are handed over as bytes",
    "value.deserializer": "records are handed over as bytes",
    "ssl.truststore.location": "JKS stores are Java-only: give ssl.ca.location (PEM)",
    "ssl.keystore.location": "JKS stores are Java-only: give ssl.certificate.location and "
    "ssl.key.location (PEM)",
}
_INT_SETTINGS = {
    "request.timeout.ms": "request_timeout_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
_FETCH_SETTINGS = {
    "fetch.max.bytes": "fetch_max_bytes",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
}
_TLS_NAMES = TlsNames(
    ca="ssl.ca.location",
    cert="ssl.certificate.location",
    key="ssl.key.location",
    key_password="ssl.key.password",
)
_JAAS_FIELD = re.compile(r"""\b(username|password)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')""")


class KafkaConfigError(ValueError):
    """A Kafka setting is unknown, malformed or contradicts another one."""


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise KafkaConfigError(f"{name}={value!r}: expected true or false")
    return lowered == "true"


def _jaas_credentials(line: str) -> tuple[str | None, str | None]:
    found = {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in
             _JAAS_FIELD.finditer(line)}  # fmt: skip
    return found.get("username"), found.get("password")


def _load_token_provider(spec: str) -> AbstractTokenProvider:
    module_name, _, attribute = spec.partition(":")
    name = "sasl.oauthbearer.token.provider"
    if not module_name or not attribute:
        raise KafkaConfigError(f"{name}={spec!r}: expected module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise KafkaConfigError(f"{name}={spec!r}: cannot load it ({err})") from None
    if not isinstance(target, AbstractTokenProvider) and callable(target):
        target = target()
    if not isinstance(target, AbstractTokenProvider):
        raise KafkaConfigError(
            f"{name}={spec!r} is a {type(target).__name__}, not an aiokafka "
            "AbstractTokenProvider (or a callable returning one)"
        )
    return target


@dataclass(frozen=True)
class KafkaSettings:
    """Validated Kafka client settings; `client_options()` and friends are aiokafka's
    keyword arguments. Build with `KafkaSettings.parse(...)`."""

    properties: Mapping[str, str] = field(default_factory=dict)
    token_provider: AbstractTokenProvider | None = None
    _ssl: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(
        cls,
        properties: Mapping[str, str] | None = None,
        *,
        token_provider: AbstractTokenProvider | None = None,
    ) -> KafkaSettings:
        """Check `properties` (Kafka names; values as strings, or anything `str()` gives
        the intended text of) and build the TLS context now, so a bad file fails here."""
        props: dict[str, str] = {}
        for raw_name, raw_value in (properties or {}).items():
            name = ALIASES.get(raw_name.strip(), raw_name.strip())
            value = str(raw_value).strip()
            if name in MANAGED:
                raise KafkaConfigError(f"{name} cannot be set here: {MANAGED[name]}")
            if name not in ACCEPTED:
                raise KafkaConfigError(
                    f"unknown Kafka setting {raw_name!r}; keyshard accepts: "
                    + ", ".join(sorted(ACCEPTED))
                )
            if name in props and props[name] != value:
                shown = REDACTED if name in SECRETS else repr(value)
                raise KafkaConfigError(f"{name} is given twice, differently (second: {shown})")
            props[name] = value
        if token_provider is None and "sasl.oauthbearer.token.provider" in props:
            token_provider = _load_token_provider(props["sasl.oauthbearer.token.provider"])
        settings = cls(props, token_provider)
        object.__setattr__(settings, "_ssl", settings._check())
        return settings

    # ---- what the settings say ----------------------------------------------------------

    @property
    def security_protocol(self) -> str:
        return self.properties.get("security.protocol", "PLAINTEXT").upper()

    @property
    def bootstrap_servers(self) -> str | None:
        return self.properties.get("bootstrap.servers")

    @property
    def isolation_level(self) -> str:
        return self.properties.get("isolation.level", "read_committed")

    @property
    def sasl_mechanism(self) -> str | None:
        mechanism = self.properties.get("sasl.mechanism")
        return mechanism.upper() if mechanism else None

    def credentials(self) -> tuple[str | None, str | None]:
        """(username, password) from sasl.username/sasl.password or sasl.jaas.config."""
        user = self.properties.get("sasl.username")
        password = self.properties.get("sasl.password")
        jaas = self.properties.get("sasl.jaas.config")
        if jaas is not None:
            jaas_user, jaas_password = _jaas_credentials(jaas)
            user, password = user or jaas_user, password or jaas_password
        return user, password

    def _check(self) -> ssl.SSLContext | None:
        """Refuse contradictions; return the TLS context the protocol needs (or None)."""
        props = self.properties
        protocol = self.security_protocol
        if protocol not in PROTOCOLS:
            raise KafkaConfigError(
                f"security.protocol={props['security.protocol']!r}: expected one of {PROTOCOLS}"
            )
        sasl = protocol.startswith("SASL_")
        tls = protocol.endswith("SSL")
        sasl_given = sorted(n for n in props if n.startswith("sasl."))
        ssl_given = sorted(n for n in props if n.startswith("ssl."))
        if not sasl and sasl_given:
            raise KafkaConfigError(
                f"{', '.join(sasl_given)} given, but security.protocol={protocol} uses no SASL "
                "(SASL_SSL or SASL_PLAINTEXT?)"
            )
        if not tls and (ssl_given or "enable.ssl.certificate.verification" in props):
            names = ssl_given or ["enable.ssl.certificate.verification"]
            raise KafkaConfigError(
                f"{', '.join(names)} given, but security.protocol={protocol} uses no TLS "
                "(SSL or SASL_SSL?)"
            )
        isolation = props.get("isolation.level")
        if isolation is not None and isolation not in ISOLATION_LEVELS:
            raise KafkaConfigError(
                f"isolation.level={isolation!r}: expected one of {ISOLATION_LEVELS}"
            )
        for name in (*_INT_SETTINGS, *_FETCH_SETTINGS):
            if name in props and not props[name].isdigit():
                raise KafkaConfigError(f"{name}={props[name]!r}: expected a whole number")
        if sasl:
            self._check_sasl()
        return self._tls_context() if tls else None

    def _check_sasl(self) -> None:
        mechanism = self.sasl_mechanism
        if mechanism is None:
            raise KafkaConfigError(
                f"security.protocol={self.security_protocol} needs sasl.mechanism "
                f"({' | '.join(MECHANISMS)})"
            )
        if mechanism not in MECHANISMS:
            raise KafkaConfigError(
                f"sasl.mechanism={mechanism}: keyshard supports {', '.join(MECHANISMS)}"
            )
        user, password = self.credentials()
        if mechanism == "OAUTHBEARER":
            if self.token_provider is None:
                raise KafkaConfigError(
                    "sasl.mechanism=OAUTHBEARER needs a token provider: "
                    "sasl.oauthbearer.token.provider=module:attribute, or token_provider= "
                    "in Python"
                )
            if user or password:
                raise KafkaConfigError(
                    "sasl.username / sasl.password are not used by OAUTHBEARER (a token is)"
                )
            return
        if self.token_provider is not None:
            raise KafkaConfigError(f"a token provider is given, but sasl.mechanism={mechanism}")
        missing = [n for n, v in (("sasl.username", user), ("sasl.password", password)) if not v]
        if missing:
            raise KafkaConfigError(f"sasl.mechanism={mechanism} needs {' and '.join(missing)}")

    def _tls_context(self) -> ssl.SSLContext:
        props = self.properties
        algorithm = props.get("ssl.endpoint.identification.algorithm", "https").lower()
        if algorithm not in ("https", "none", ""):
            raise KafkaConfigError(
                f"ssl.endpoint.identification.algorithm={algorithm!r}: expected https or none"
            )
        verify = _flag(
            "enable.ssl.certificate.verification",
            props.get("enable.ssl.certificate.verification", "true"),
        )
        try:
            return client_context(
                ca_file=props.get("ssl.ca.location"),
                cert_file=props.get("ssl.certificate.location"),
                key_file=props.get("ssl.key.location"),
                key_password=props.get("ssl.key.password"),
                check_hostname=algorithm == "https",
                verify=verify,
                names=_TLS_NAMES,
            )
        except TlsConfigError as err:
            raise KafkaConfigError(str(err)) from None

    # ---- aiokafka keyword arguments -------------------------------------------------

    def client_options(self) -> dict[str, Any]:
        """For every aiokafka client (consumer, producer, admin, plain client)."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self._ssl is not None:
            options["ssl_context"] = self._ssl
        if self.security_protocol.startswith("SASL_"):
            options["sasl_mechanism"] = self.sasl_mechanism
            if self.token_provider is not None:
                options["sasl_oauth_token_provider"] = self.token_provider
            else:
                user, password = self.credentials()
                options["sasl_plain_username"] = user
                options["sasl_plain_password"] = password
        if client_id := self.properties.get("client.id"):
            options["client_id"] = client_id
        for name, option in _INT_SETTINGS.items():
            if name in self.properties:
                options[option] = int(self.properties[name])
        return options

    def consumer_options(self) -> dict[str, Any]:
        """For AIOKafkaConsumer: also the isolation level (read_committed by default:
        records of aborted transactions are never handed to a handler) and the fetch
        sizes when they are set."""
        options = {**self.client_options(), "isolation_level": self.isolation_level}
        for name, option in _FETCH_SETTINGS.items():
            if name in self.properties:
                options[option] = int(self.properties[name])
        return options

    def admin_options(self) -> dict[str, Any]:
        """For AIOKafkaAdminClient, which takes no metadata age or idle settings."""
        skip = {"metadata_max_age_ms", "retry_backoff_ms"}
        return {k: v for k, v in self.client_options().items() if k not in skip}

    def redacted(self) -> dict[str, str]:
        """The settings with every secret value hidden: what logs and APIs may show."""
        return {k: REDACTED if k in SECRETS else v for k, v in sorted(self.properties.items())}

    def __repr__(self) -> str:
        provider = type(self.token_provider).__name__ if self.token_provider else None
        return f"KafkaSettings({self.redacted()!r}, token_provider={provider})"

    def with_bootstrap(self, bootstrap_servers: str | None) -> str:
        """The cluster to use: the explicit argument, or bootstrap.servers; both given and
        different is a contradiction, neither is an error."""
        given = self.bootstrap_servers
        if bootstrap_servers and given and bootstrap_servers != given:
            raise KafkaConfigError(
                f"bootstrap servers given twice, differently: {bootstrap_servers!r} and "
                f"bootstrap.servers={given!r}"
            )
        chosen = bootstrap_servers or given
        if not chosen:
            raise KafkaConfigError("no bootstrap servers: give bootstrap.servers")
        return chosen


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a Java `.properties` file (as Kafka's tools take `--command-config`):
    `key=value` or `key: value` or `key value`, `#`/`!` comments, a trailing backslash
    continues a line, `\\` escapes the next character."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise KafkaConfigError(f"cannot read Kafka config {path}: {err.strerror}") from None
    return parse_properties(text.splitlines(), str(path))


def parse_properties(lines: Iterable[str], source: str = "properties") -> dict[str, str]:
    props: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(lines, 1):
        line = pending + raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if _continues(line):
            pending = line[:-1]
            continue
        pending = ""
        key, value = _split_property(line.rstrip())
        if not key:
            raise KafkaConfigError(f"{source}:{number}: no setting name in {raw[:40]!r}")
        props[key] = value
    if pending:
        key, value = _split_property(pending)
        props[key] = value
    return props


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), text)


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            i += 2
            continue
        if char in "=: \t":
            break
        i += 1
    key, rest = line[:i], line[i:].lstrip(" \t")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t")
    return _unescape(key), _unescape(rest)


def from_environment(
    environ: Mapping[str, str],
    prefix: str = "KEYSHARD_KAFKA_",
    exclude: Collection[str] = ("KEYSHARD_KAFKA_CONFIG",),
) -> dict[str, str]:
    """`KEYSHARD_KAFKA_SASL_PASSWORD=...` -> `sasl.password`: Kafka's names have only dots,
    so underscores map back unambiguously (the convention of Kafka's container images).
    `exclude`: variables of the daemon's own flags that share the prefix."""
    return {
        name[len(prefix) :].lower().replace("_", "."): value
        for name, value in environ.items()
        if name.startswith(prefix) and len(name) > len(prefix) and name not in exclude
    }
