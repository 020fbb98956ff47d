"""The daemon's pure helpers (the daemon itself runs in the integration tests)."""

from __future__ import annotations

import socket

import pytest

from keyshard.coordinator.server.authentication import Authentication
from keyshard.daemon import DaemonConfig, admin_url, default_replica_id


@pytest.mark.parametrize(
    ("advertised", "expected"),
    [
        ("10.0.0.5:7171", "http://10.0.0.5:7172"),
        ("coord-0.example:7171", "http://coord-0.example:7172"),
        ("fd00::5:7171", "http://[fd00::5]:7172"),
        ("[fd00::5]:7171", "http://[fd00::5]:7172"),
    ],
)
def test_the_admin_url_of_a_replica_is_a_valid_url(advertised: str, expected: str) -> None:
    assert admin_url(advertised, 7172, https=False) == expected
    assert admin_url(advertised, 7172, https=True) == expected.replace("http:", "https:")


def test_the_daemon_config_keeps_its_secrets_out_of_its_repr() -> None:
    config = DaemonConfig(
        "kafka:9092", "127.0.0.1", 0, "127.0.0.1", 0,
        authentication=Authentication(shared_token="Zq9-consumers"),
        admin_token="Zq9-admin",
    )  # fmt: skip
    assert config.admin_token == "Zq9-admin"
    assert "Zq9" not in repr(config) and "kafka:9092" in repr(config)


def test_a_bare_replica_is_named_by_its_host_and_listen_address() -> None:
    """The same host and listen address give the same name (a restart in place is the
    same replica); a different address on the host, another one. Port 0 has no stable
    address: every process is a new replica."""
    host = socket.gethostname()
    assert default_replica_id("0.0.0.0", 7171) == f"{host}:7171"
    assert default_replica_id("0.0.0.0", 7171) == default_replica_id("0.0.0.0", 7171)
    assert default_replica_id("127.0.0.1", 7171) == f"{host}:127.0.0.1:7171"
    assert default_replica_id("::1", 7171) == f"{host}:[::1]:7171"
    assert default_replica_id("0.0.0.0", 7181) != default_replica_id("0.0.0.0", 7171)
    assert default_replica_id("0.0.0.0", 0) != default_replica_id("0.0.0.0", 0)
