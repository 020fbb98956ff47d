"""The `keyshard` source's durations are options in milliseconds. The names they had in
seconds (`connect_timeout_s`, `stall_timeout_s`, `timeout_s`) are taken for one release,
with a FutureWarning naming the new option; both names given is a `SourceError`. Pure: the
settings objects are built without Spark or Kafka."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from keyshard.spark_jobs.planning import SourceError, parse_ms
from keyshard.spark_jobs.reading import ReadSettings
from keyshard.spark_jobs.source import BatchReader
from keyshard.spark_jobs.stream import StreamSettings

BASE = {"group": "g", "topics": "t", "coordinator": "127.0.0.1:7171",
        "bootstrap_servers": "127.0.0.1:9092"}  # fmt: skip

# option in ms -> the setting it makes, in seconds (what asyncio takes)
SETTINGS: dict[str, Callable[[dict[str, str]], float]] = {
    "connect_timeout_ms": lambda o: StreamSettings(o, 2).connect_timeout,
    "stall_timeout_ms": lambda o: ReadSettings(o).stall_timeout,
    "timeout_ms": lambda o: BatchReader(o, 2).timeout,
}
DEFAULTS = {"connect_timeout_ms": 30.0, "stall_timeout_ms": 30.0, "timeout_ms": 15.0}


@pytest.mark.parametrize("name", SETTINGS)
def test_milliseconds_and_the_default_warn_about_nothing(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SETTINGS[name](BASE) == DEFAULTS[name]
        assert SETTINGS[name]({**BASE, name: "1500"}) == 1.5


@pytest.mark.parametrize("name", SETTINGS)
def test_the_seconds_name_still_works_and_names_its_replacement(name: str) -> None:
    old = name.removesuffix("_ms") + "_s"
    expected = rf"option '{old}' is deprecated: use '{name}', in milliseconds"
    with pytest.warns(FutureWarning, match=expected):
        assert SETTINGS[name]({**BASE, old: "2"}) == 2.0


@pytest.mark.parametrize("name", SETTINGS)
def test_both_names_are_refused(name: str) -> None:
    old = name.removesuffix("_ms") + "_s"
    with pytest.raises(SourceError, match=f"option '{name}' and its deprecated name '{old}'"):
        SETTINGS[name]({**BASE, name: "1500", old: "2"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"wait_ms": "0"}, r"option 'wait_ms'=0 is outside 1"),
        ({"wait_ms": "1.5"}, "option 'wait_ms' must be an integer"),
        ({"wait_s": "0"}, r"option 'wait_s'=0 is outside 1"),
    ],
)
def test_bad_durations_name_their_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_ms(options, "wait_ms", 1000)
