"""The server's bounds on what a member may ask for (`coordinator.group.bounds`): Kafka's
group.max.size and session timeout bounds, a capacity cap, a bounded speed factor."""

from __future__ import annotations

import pytest

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group.bounds import (
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_MEMBERS_PER_GROUP,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    Bounds,
)
from keyshard.coordinator.group.speed import speed_factors
from keyshard.coordinator.group.state import GroupState
from keyshard.core.protocol.messages import ErrorCode
from tests.coordinator.group.test_handlers import TPS, apply


def register(state: GroupState, mid: str, *, capacity: int = 1, session_ms: int = 10_000):  # type: ignore[no-untyped-def]
    return h.register(
        state, member_id=mid, name=mid, capacity=capacity, session_timeout_ms=session_ms,
        topics=("t",), partitions=TPS, now=0.0,
    )  # fmt: skip


def test_the_defaults_fit_what_the_tests_and_benchmarks_run() -> None:
    """5,000 members in one group, 150 groups on a replica, 1 s sessions in tests and
    10 s by default in workers; the five-minute squat of the issue is out."""
    assert DEFAULT_MAX_MEMBERS_PER_GROUP >= 5_000 and DEFAULT_MAX_GROUPS >= 150
    assert DEFAULT_MIN_SESSION_TIMEOUT_MS <= 1_000 <= 10_000 <= DEFAULT_MAX_SESSION_TIMEOUT_MS
    assert DEFAULT_MAX_SESSION_TIMEOUT_MS < 300_000


@pytest.mark.parametrize("session_ms", [999, 60_001, 300_000])
def test_a_session_timeout_out_of_bounds_is_refused(session_ms: int) -> None:
    state = GroupState("g", bounds=Bounds(min_session_timeout_ms=1000))
    result = register(state, "squatter", session_ms=session_ms)
    assert result.error is not None and not result.records
    code, message = result.error
    assert code is ErrorCode.INVALID_SESSION_TIMEOUT
    assert f"session_timeout_ms {session_ms} is outside" in message and "1000..60000" in message


def test_a_full_group_refuses_one_more_member() -> None:
    state = GroupState("g", bounds=Bounds(max_members_per_group=2))
    for mid in ("a", "b"):
        apply(state, register(state, mid))
    result = register(state, "c")
    assert result.error is not None and result.error[0] is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert "--max-members-per-group" in result.error[1]


def test_capacity_is_capped_not_refused() -> None:
    state = GroupState("g", bounds=Bounds(max_capacity=50))
    apply(state, register(state, "greedy", capacity=100_000))
    assert state.members["greedy"].capacity == 50


def test_group_cap_is_the_runtimes_to_check() -> None:
    bounds = Bounds(max_groups=2)
    assert bounds.groups_refusal("g", 1) is None
    refused = bounds.groups_refusal("g", 2)
    assert refused is not None and refused[0] is ErrorCode.TOO_MANY_GROUPS


def test_bounds_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="minimum session timeout"):
        Bounds(min_session_timeout_ms=20_000, max_session_timeout_ms=10_000)
    with pytest.raises(ValueError, match="max_speed_factor"):
        Bounds(max_speed_factor=0.5)


def test_a_speed_factor_stays_within_the_bound_either_way() -> None:
    """A member claiming to be a million times faster counts four times at most; with two
    members the median is halfway to the liar, and the honest one is not weighed down to
    nothing either."""
    factors = speed_factors({"liar": (1, 1.67e9), "a": (1, 1000.0), "b": (1, 1000.0)}, 4.0)
    assert factors == {"liar": 4.0, "a": 1.0, "b": 1.0}
    factors = speed_factors({"liar": (1, 1.67e9), "a": (1, 1000.0)}, 4.0)
    assert factors["liar"] == pytest.approx(2.0) and factors["a"] == 0.25
