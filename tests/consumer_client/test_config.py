"""`CoordinatedConsumer` refuses a bad configuration at construction, with a ValueError
that names what is wrong, rather than failing later inside `run()`."""

from __future__ import annotations

from typing import Any

import pytest

from keyshard.consumer_client import CoordinatedConsumer


def _consumer(**overrides: Any) -> CoordinatedConsumer:
    config: dict[str, Any] = {
        "group": "g",
        "topics": ["t"],
        "coordinator": "127.0.0.1:7171",
        "bootstrap_servers": "127.0.0.1:9092",
    }
    config.update(overrides)
    return CoordinatedConsumer(**config)


def test_a_valid_config_is_accepted() -> None:
    consumer = _consumer(coordinator="127.0.0.1:7171, coord-b:7172", max_concurrency=1)
    assert consumer.coordinators == [("127.0.0.1", 7171), ("coord-b", 7172)]
    assert consumer.topics == ["t"]


def test_no_topics_is_rejected() -> None:
    with pytest.raises(ValueError, match="topic"):
        _consumer(topics=[])


@pytest.mark.parametrize(
    ("coordinator", "bad"),
    [
        ("nohost", "nohost"),
        ("127.0.0.1:", "127.0.0.1:"),
        (":7171", ":7171"),
        ("127.0.0.1:abc", "127.0.0.1:abc"),
        ("127.0.0.1:7171,nohost", "nohost"),
        ("127.0.0.1:99999", "127.0.0.1:99999"),
    ],
)
def test_bad_coordinator_address_is_rejected_naming_it(coordinator: str, bad: str) -> None:
    with pytest.raises(ValueError) as info:
        _consumer(coordinator=coordinator)
    assert bad in str(info.value)


@pytest.mark.parametrize("max_concurrency", [0, -1])
def test_max_concurrency_below_one_is_rejected(max_concurrency: int) -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        _consumer(max_concurrency=max_concurrency)


@pytest.mark.parametrize(
    ("name", "match"),
    [("", "1..255 characters"), ("n" * 256, "1..255 characters"), ("a\nb", "line breaks")],
)
def test_a_name_the_coordinator_would_refuse_is_rejected(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _consumer(name=name)
