"""`reconcile` reads the state and returns records: it never changes the state itself.

The rule of the group core is that `replay` is the only mutator. Every reconcile of a
random membership churn runs on the live state and again on a deep copy taken before:
the state must equal the copy afterwards, and both calls must return the same result.
"""

from __future__ import annotations

import copy
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group.effects import Result, SendStart, SendStop
from keyshard.coordinator.group.state import GroupState
from keyshard.core.model.positions import Position
from tests.coordinator.group.test_handlers import (
    ASSIGNOR,
    TPS,
    apply,
    join,
    ping,
    report,
    started,
    stopped,
)


def pure_reconcile(state: GroupState, now: float, recompute: bool) -> Result:
    before = copy.deepcopy(state)
    result = h.reconcile(state, now=now, assignor=ASSIGNOR, recompute=recompute)
    assert state == before, "reconcile changed the state it was given"
    again = h.reconcile(before, now=now, assignor=ASSIGNOR, recompute=recompute)
    assert again == result, "reconcile of an equal state answered differently"
    return result


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_reconcile_changes_nothing_through_random_churn(seed: int) -> None:
    rng = random.Random(seed)
    state, now, n = GroupState("g"), 0.0, 0
    stops: list[SendStop] = []
    starts: list[SendStart] = []

    def do(result: Result) -> None:
        effects = apply(state, result)
        effects += apply(state, pure_reconcile(state, now, recompute=rng.random() < 0.7))
        stops.extend(e for e in effects if isinstance(e, SendStop))
        starts.extend(e for e in effects if isinstance(e, SendStart))

    for _ in range(30):
        now += rng.choice([0.0, 0.5, 2.0])
        action = rng.randrange(5)
        mids = sorted(state.members)
        if action == 0 or not mids:
            n += 1
            do(join(state, f"m{n}", now))
        elif action == 1 and stops:
            stop = stops.pop(0)
            do(stopped(state, stop, now, report(stop.ranges, {TPS[0]: Position(n)})))
        elif action == 2 and starts:
            do(started(state, starts.pop(0), now))
        elif action == 3:
            do(h.leave(state, member_id=rng.choice(mids), positions={}, now=now))
        else:
            do(ping(state, rng.choice(mids), now))
    assert state.members or n
