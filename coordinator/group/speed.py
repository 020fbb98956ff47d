"""Each member's speed, measured: records completed per second of handler time.

The load-aware balance spreads demand so that every member needs the same time to drain
its share. A declared capacity says what a member should manage; a pod on a busy node, a
smaller instance type, or a handler whose downstream slowed for this pod alone manages
less, and the member that holds its share longest decides when the group is done. So the
balance weighs members by what they achieve (docs/protocol.md §8.7).

Per second of *handler time*, not per second: a member with little to do completes
little, and the same member is as fast when idle as when busy. Each Ping reply carries
the records completed by handlers that held a lane and the time lanes were held, in
seconds of the member's whole concurrency (`busy_ms`: eight lanes busy for a second of
`max_concurrency` 8 are one second), so a member whose work is one hot key, using one
lane of eight, is not mistaken for a slow one. Handlers that complete inline are left
out (docs/protocol.md §8.7 says why).

Speeds only ever count against the group's own median, and within `DEAD_BAND` of it
they count as equal: identical members measure a few percent apart from sample to
sample, and a weight that wobbled with them would move ranges for nothing. Beyond the
server's bound (`--max-speed-factor`) they count no further, either way: a member's
speed is what it says of itself (checked against its positions' advance, but a fast
liar could still claim the speed of every record it passes), and with two members the
median is halfway to a liar, so an unbounded factor would let one member weigh the
others down to nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

#: Handler time and completions gathered before they make a sample: enough that one
#: slow record, or the clock's grain, does not decide a member's speed.
MIN_BUSY_S = 0.5
MIN_RECORDS = 20
#: Weight of a new sample in the running estimate (about the last three samples count).
SMOOTHING = 0.3
#: Speeds (per unit of declared capacity) within this factor of the group's median are
#: taken as equal.
DEAD_BAND = 1.5


@dataclass(slots=True)
class SpeedMeter:
    """One member's measured speed (records per second of handler time), None until
    enough has been measured; what is gathered toward the next sample."""

    speed: float | None = None
    records: int = 0
    busy_s: float = 0.0

    def add(self, completed: int, busy_s: float) -> None:
        self.records += completed
        self.busy_s += busy_s
        if self.busy_s < MIN_BUSY_S or self.records < MIN_RECORDS:
            return
        sample = self.records / self.busy_s
        previous = self.speed
        self.speed = sample if previous is None else previous + SMOOTHING * (sample - previous)
        self.records, self.busy_s = 0, 0.0


def speed_factors(
    members: Mapping[str, tuple[int, float | None]], max_factor: float = float("inf")
) -> dict[str, float]:
    """Per member (capacity, measured speed or None): the factor its capacity is weighed
    with, its speed per unit of capacity over the group's median, 1.0 within the dead
    band and for members not measured yet (they are taken to be typical), and within
    1/`max_factor`..`max_factor`. Fewer than two measured members: no median to compare
    with, every factor is 1.0."""
    per_unit = {
        mid: speed / max(1, capacity)
        for mid, (capacity, speed) in members.items()
        if speed is not None and speed > 0
    }
    if len(per_unit) < 2:
        return dict.fromkeys(members, 1.0)
    median = statistics.median(per_unit.values())
    factors = {}
    for mid in members:
        ratio = per_unit.get(mid, median) / median
        ratio = min(max(ratio, 1 / max_factor), max_factor)
        factors[mid] = 1.0 if 1 / DEAD_BAND <= ratio <= DEAD_BAND else ratio
    return factors
