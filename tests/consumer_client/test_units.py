"""One unit, milliseconds, for every duration the library takes; the names that were in
seconds still work for one release, with a DeprecationWarning naming the new one; and
every argument of `CoordinatedConsumer` is documented in its docstring."""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings
from typing import Any, cast

import pytest

from keyshard.consumer_client import (
    ConsumerError,
    CoordinatedConsumer,
    MemberHooks,
    Membership,
    RetryPolicy,
)
from keyshard.local.processes import free_port

BASE: dict[str, Any] = dict(
    group="g", topics=["t"], coordinator="127.0.0.1:7171", bootstrap_servers="127.0.0.1:9092"
)


def test_the_millisecond_names_warn_about_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        consumer = CoordinatedConsumer(**BASE, drain_timeout_ms=2500, connect_timeout_ms=1500)
        RetryPolicy(initial_backoff_ms=20, max_backoff_ms=200, max_attempts=3)
        Membership(
            group="g", topics=["t"], coordinators=[("127.0.0.1", 7171)], name="m",
            session_timeout_ms=10_000, capacity=1, connect_timeout_ms=1500,
        )  # fmt: skip
    assert (consumer.drain_timeout_ms, consumer.connect_timeout_ms) == (2500, 1500)


@pytest.mark.parametrize(
    ("old", "seconds", "new", "ms"),
    [("drain_timeout_s", 2.5, "drain_timeout_ms", 2500),
     ("connect_timeout_s", 0.75, "connect_timeout_ms", 750)],
)  # fmt: skip
def test_the_second_names_still_work_and_name_their_replacement(
    old: str, seconds: float, new: str, ms: int
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{old}=\.\.\.\) is deprecated: pass {new}"):
        consumer = CoordinatedConsumer(**BASE, **cast(dict[str, Any], {old: seconds}))
    assert getattr(consumer, new) == ms


def test_the_warning_points_at_the_caller() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        CoordinatedConsumer(**BASE, drain_timeout_s=1)  # type: ignore[call-arg]
    assert caught[0].filename == __file__


async def test_a_deprecated_connect_timeout_reaches_the_membership() -> None:
    """Real sockets, nothing listening: refused until the timeout, given in seconds."""
    address = ("127.0.0.1", free_port())
    with pytest.warns(DeprecationWarning, match="connect_timeout_ms"):
        membership = Membership(
            group="g", topics=["t"], coordinators=[address], name="m",
            session_timeout_ms=10_000, capacity=1, connect_timeout_s=0.5,  # type: ignore[call-arg]
        )  # fmt: skip
    with pytest.raises(ConsumerError, match=r"within the connect timeout \(0.5 s\)"):
        await asyncio.wait_for(membership.run(cast(MemberHooks, None)), 30)


def test_passing_both_names_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="both drain_timeout_ms and its old name drain_timeout_s"):
        CoordinatedConsumer(**BASE, drain_timeout_ms=1000, drain_timeout_s=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="both connect_timeout_ms and its old name"):
        CoordinatedConsumer(**BASE, connect_timeout_ms=None, connect_timeout_s=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="both max_backoff_ms"):
        RetryPolicy(max_backoff_ms=10, max_backoff_s=0.01)  # type: ignore[call-arg]


def test_a_retry_policy_in_seconds_is_the_same_policy_in_ms() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        old = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, max_attempts=3)  # type: ignore[call-arg]
    assert sorted(str(w.message).split(" is")[0] for w in caught) == [
        "RetryPolicy(initial_backoff_s=...)", "RetryPolicy(max_backoff_s=...)",
    ]  # fmt: skip
    assert old == RetryPolicy(initial_backoff_ms=20, max_backoff_ms=200, max_attempts=3)
    assert RetryPolicy() == RetryPolicy(initial_backoff_ms=50, max_backoff_ms=5000, max_attempts=5)


def test_a_retry_policy_takes_no_positional_seconds() -> None:
    """Positional arguments were seconds: refused, rather than read as milliseconds."""
    with pytest.raises(TypeError):
        cast(Any, RetryPolicy)(0.05, 5.0)


def test_every_argument_is_documented_with_its_default() -> None:
    doc = inspect.getdoc(CoordinatedConsumer) or ""
    entry = r"^    (\w+) \([^)]*\): (.*?)(?=^    \w+ \(|^\S|\Z)"
    described = dict(re.findall(entry, doc, re.M | re.S))
    parameters = [p for p in inspect.signature(CoordinatedConsumer).parameters if p != "self"]
    assert sorted(described) == sorted(parameters)
    required = {"group", "topics", "coordinator"}
    undefaulted = [p for p in parameters if p not in required and "Default" not in described[p]]
    assert not undefaulted, undefaulted
