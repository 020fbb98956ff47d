"""Alive means making progress (`coordinator.group.stalls`): a member with records waiting
in its slots and positions that stand still for the bound is fenced; a slow one is not.
The rule alone, then as Ping replies drive it, on a hand-driven clock."""

from __future__ import annotations

import pytest

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group.demand import BucketDemand
from keyshard.coordinator.group.effects import CloseMember, Effect, QuarantineTimer, SetTimer
from keyshard.coordinator.group.stalls import (
    DEFAULT_STALL_TIMEOUT_MS,
    latest_readers,
    read_by_others,
    stall_verdict,
    stalled_since,
)
from keyshard.coordinator.group.state import GroupConfig, GroupState
from keyshard.core.protocol.messages import ErrorCode
from tests.coordinator.group.test_balance import buckets_of
from tests.coordinator.group.test_handlers import (
    MARGIN,
    SESSION,
    TPS,
    group3,
    moved_on,
    of,
    run,
)

__all__ = ["group3"]  # the fixture, imported to be found here


# ---- the rule -------------------------------------------------------------------------


def test_the_clock_runs_only_while_records_wait_and_positions_stand_still() -> None:
    assert stalled_since(None, waiting=0.0, advanced=False, now=5.0) is None  # idle
    assert stalled_since(None, waiting=0.9, advanced=False, now=5.0) is None  # a fraction
    assert stalled_since(None, waiting=40.0, advanced=False, now=5.0) == 5.0
    assert stalled_since(5.0, waiting=40.0, advanced=False, now=8.0) == 5.0
    assert stalled_since(5.0, waiting=40.0, advanced=True, now=8.0) is None  # any progress
    assert stalled_since(5.0, waiting=0.0, advanced=False, now=8.0) is None  # done


def test_a_verdict_only_past_the_bound_naming_what_the_member_says() -> None:
    quiet: dict[tuple[str, int], float] = {}
    assert stall_verdict(None, now=50.0, bound_s=10.0, waiting=9.0, silences=quiet) is None
    assert stall_verdict(41.0, now=50.0, bound_s=10.0, waiting=9.0, silences=quiet) is None
    handlers = stall_verdict(40.0, now=50.0, bound_s=10.0, waiting=9.0, silences=quiet)
    assert handlers == (
        "no progress for 10.0 s while about 9 records wait in its slots "
        "(its handlers completed none of them)"
    )
    cut = stall_verdict(
        40.0, now=50.0, bound_s=10.0, waiting=9.0, silences={TPS[1]: 12.0, TPS[0]: 0.2}
    )
    assert cut is not None and cut.endswith("(it has fetched nothing of t[1])")


def test_what_waits_is_what_waits_in_the_members_buckets() -> None:
    """`BucketDemand.waiting_in` says of some buckets what `backlog` says of them all."""
    demand = BucketDemand()
    demand.fetched(TPS[0], 0, 100, [(0, 30), (5, 70)], at=1.0)
    backlog = demand.backlog(4.0)
    assert backlog is not None
    assert demand.waiting_in([0], 4.0) == pytest.approx(backlog[0])
    assert demand.waiting_in([0, 5, 9], 4.0) == pytest.approx(backlog[0] + backlog[5])
    assert 96 < demand.waiting_in(range(4096), 4.0) < 97  # 100, faded 3 s of 60 s half-life
    assert BucketDemand().waiting_in([0], 4.0) == 0.0


def test_only_other_members_reads_are_evidence() -> None:
    readers = latest_readers((), "m1", 1.0)
    assert not read_by_others(readers, "m1", since=0.0)  # its own word only
    readers = latest_readers(readers, "m2", 2.0)
    readers = latest_readers(readers, "m2", 3.0)
    assert readers == (("m2", 3.0), ("m1", 1.0))
    assert read_by_others(readers, "m1", since=2.5)
    assert not read_by_others(readers, "m1", since=3.5)  # not lately
    assert read_by_others(readers, "m2", since=0.5) and not read_by_others(readers, "m2", since=2)


# ---- as Ping replies drive it ----------------------------------------------------------


def backlog_on(state: GroupState, mid: str, now: float, end: int = 1200) -> None:
    """Another member's fetch of TPS[0] up to `end` saw 30 records in each of 40 of
    `mid`'s buckets: records wait there, as the others see them."""
    reader = next(m for m in state.members if m != mid)
    counts = tuple((b, 30) for b in buckets_of(state.target[mid], 40))
    reply = h.ping_answered(
        state, member_id=reader, epoch=state.members[reader].epoch, now=now,
        positions=moved_on(state, reader, 1), load=(), fetched=[(TPS[0], 0, end, counts)],
    )  # fmt: skip
    run(state, reply, now)


def pinged(state: GroupState, mid: str, now: float, done: int = 0, **kw: object) -> list[Effect]:
    m = state.members[mid]
    reply = h.ping_answered(
        state, member_id=mid, epoch=m.epoch, positions=moved_on(state, mid, done), load=(),
        now=now, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return list(run(state, reply, now))


def test_a_member_that_completes_nothing_while_records_wait_is_fenced_after_the_bound(
    group3: GroupState,
) -> None:
    state = group3
    state.config = GroupConfig(stall_timeout_ms=10_000)
    backlog_on(state, "m1", 2.0)
    assert pinged(state, "m1", 2.0) and "m1" in state.members  # the clock starts
    for now in (5.0, 8.0, 11.0):
        backlog_on(state, "m1", now, end=1200 + int(now))
        pinged(state, "m1", now, silences={TPS[0]: now - 1.5})
        assert "m1" in state.members
    backlog_on(state, "m1", 12.0, end=1300)
    effects = pinged(state, "m1", 12.0, silences={TPS[0]: 10.5, TPS[1]: 10.5})
    assert "m1" not in state.members
    (close,) = of(effects, CloseMember)
    assert close.code is ErrorCode.FENCED_MEMBER
    assert close.message.startswith("no progress for 10.0 s while about ")
    assert close.message.endswith("(it has fetched nothing of t[0], t[1])")
    # Its ranges move from its last positions once it must have stopped.
    quarantine = [e for e in of(effects, SetTimer) if isinstance(e.key, QuarantineTimer)]
    assert [e.at for e in quarantine] == [12.0 + SESSION + MARGIN]


def test_a_member_that_progresses_however_little_is_slow_not_failed(
    group3: GroupState,
) -> None:
    state = group3
    for now in range(2, 40, 3):
        backlog_on(state, "m1", float(now), end=1200 + now)
        pinged(state, "m1", float(now), done=1)
    assert "m1" in state.members and state.members["m1"].stalled_since is None


def test_an_idle_member_is_never_judged(group3: GroupState) -> None:
    state = group3
    for now in range(2, 40, 3):
        pinged(state, "m1", float(now))
    assert "m1" in state.members and state.members["m1"].stalled_since is None


@pytest.mark.parametrize("bound_ms", [3_000, 20_000, None])
def test_the_bound_is_a_group_setting(group3: GroupState, bound_ms: int | None) -> None:
    """None: the default, longer than the members' 10 s session."""
    state = group3
    state.config = GroupConfig(stall_timeout_ms=bound_ms)
    backlog_on(state, "m1", 2.0)
    pinged(state, "m1", 2.0)
    now = 2.0
    while "m1" in state.members and now < 100.0:
        now += 1.0
        backlog_on(state, "m1", now, end=1200 + int(now))
        pinged(state, "m1", now)
    assert now == 2.0 + (bound_ms or DEFAULT_STALL_TIMEOUT_MS) / 1000


def test_a_member_whose_backlog_only_it_reads_is_not_judged(group3: GroupState) -> None:
    """Its own fetched windows are its own word: nobody else saw the records wait."""
    state = group3
    counts = tuple((b, 30) for b in buckets_of(state.target["m1"], 40))
    for now in range(2, 40, 3):
        pinged(state, "m1", float(now), fetched=[(TPS[0], 0, 1200 + now, counts)])
    assert "m1" in state.members and state.members["m1"].stalled_since is None


def test_a_backlog_the_others_read_once_stays_evidence(group3: GroupState) -> None:
    """Everything was fetched at once and nothing new comes: nobody reports fetches any
    more, and the records still wait."""
    state = group3
    state.config = GroupConfig(stall_timeout_ms=10_000)
    backlog_on(state, "m1", 2.0)
    for now in (3.0, 6.0, 9.0, 12.0):
        pinged(state, "m1", now)
    assert "m1" in state.members
    pinged(state, "m1", 13.0)
    assert "m1" not in state.members
