"""Balance and movement of the assignment strategies under Zipf-skewed keys.

For each key skew s (key i weighs 1/(i+1)^s over 100,000 keys "key-{i}", hashed to slots
with `slot_for_key`), member count (capacity 1 each) and strategy:

- max/mean: the busiest member's share of the load over its capacity share (`imbalance`;
  1.00 is perfect) for the strategy's assignment of a fresh group, and the same after
  one random join / one random leave from it (averaged over the trials);
- bound: `achievable_imbalance`, the floor set by the hottest slot (a slot cannot be
  split, so no strategy can beat it);
- movement per join / per leave, averaged over random joins and leaves, in slots and in
  share of the load, against the minimum any strategy must move: what the joiner ends up
  owning / what the leaver owned. "x" = moved / minimum (1.00 = nothing else moved).

A second table sweeps load-aware's `tolerance`. Writes bench/results/balance.md
and bench/results/balance.png (needs matplotlib) and prints the tables.
Run: bash scripts/bench.sh balance
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import RESULTS
from keyshard.coordinator.strategies.base import AssignmentSpec, Assignor, MemberSpec, slots_moved
from keyshard.coordinator.strategies.load_aware import LoadAwareAssignor
from keyshard.coordinator.strategies.measures import achievable_imbalance, imbalance
from keyshard.coordinator.strategies.registry import strategy_named
from keyshard.core.model.hashing import SLOT_COUNT, slot_for_key
from keyshard.core.model.ranges import EMPTY, RangeSet

SKEWS = (0.0, 0.8, 1.1, 1.5)
MEMBER_COUNTS = (4, 16, 64)
STRATEGIES = ("balanced", "consistent-hash", "auto-split", "load-aware")
TOLERANCES = (0.02, 0.05, 0.10, 0.25)
KEYS = 100_000
TRIALS = 8
SEED = 20240601


@dataclass(frozen=True)
class Move:
    slots: float
    slots_min: float
    load: float  # share of the total load that changed owner
    load_min: float
    after: float  # max/mean after the change

    def slots_x(self) -> float:
        return self.slots / self.slots_min if self.slots_min else float("nan")

    def load_x(self) -> float:
        return self.load / self.load_min if self.load_min else float("nan")


@dataclass(frozen=True)
class Row:
    skew: float
    members: int
    strategy: str
    max_mean: float
    bound: float
    join: Move
    leave: Move


def zipf_load(slots: list[int], s: float) -> list[float]:
    load = [0.0] * SLOT_COUNT
    for i, slot in enumerate(slots):
        load[slot] += 1.0 / (i + 1) ** s
    return load


def share(load: list[float], owned: RangeSet) -> float:
    return sum(sum(load[r.start : r.end + 1]) for r in owned) / sum(load)


def average(moves: list[Move]) -> Move:
    n = len(moves)
    return Move(
        sum(m.slots for m in moves) / n,
        sum(m.slots_min for m in moves) / n,
        sum(m.load for m in moves) / n,
        sum(m.load_min for m in moves) / n,
        sum(m.after for m in moves) / n,
    )


def measure(strategy: Assignor, load: list[float], n: int, skew: float, seed: int) -> Row:
    rng = random.Random(seed)
    members = tuple(MemberSpec(f"c{i:03d}") for i in rng.sample(range(1000), n))
    base = strategy.assign(AssignmentSpec(members, {}, load))
    # The group's steady state: what the strategy keeps when nothing changes.
    base = strategy.assign(AssignmentSpec(members, dict(base.ranges), load))
    joins: list[Move] = []
    leaves: list[Move] = []
    for _ in range(TRIALS):
        joiner = MemberSpec(f"j{rng.randrange(10**6):06d}")
        grown = (*members, joiner)
        target = strategy.assign(AssignmentSpec(grown, dict(base.ranges), load))
        got = target.ranges[joiner.member_id]
        lost = [base.ranges[m] - target.ranges.get(m, EMPTY) for m in base.ranges]
        joins.append(
            Move(
                slots_moved(base.ranges, target.ranges),
                got.size,
                sum(share(load, x) for x in lost),
                share(load, got),
                imbalance(target, load, grown),
            )
        )
        leaver = rng.choice(members)
        shrunk = tuple(m for m in members if m is not leaver)
        target = strategy.assign(AssignmentSpec(shrunk, dict(base.ranges), load))
        lost = [base.ranges[m] - target.ranges.get(m, EMPTY) for m in base.ranges]
        leaves.append(
            Move(
                slots_moved(base.ranges, target.ranges),
                base.ranges[leaver.member_id].size,
                sum(share(load, x) for x in lost),
                share(load, base.ranges[leaver.member_id]),
                imbalance(target, load, shrunk),
            )
        )
    return Row(
        skew,
        n,
        strategy.name,
        imbalance(base, load, members),
        achievable_imbalance(load, members),
        average(joins),
        average(leaves),
    )


def cell(m: Move) -> str:
    return (
        f"{m.slots:.0f} / {m.slots_min:.0f} ({m.slots_x():.2f}x) "
        f"| {m.load:.1%} / {m.load_min:.1%} ({m.load_x():.2f}x) | {m.after:.2f}"
    )


def table(rows: list[Row], label: str = "strategy") -> str:
    lines = [
        f"| s | members | {label} | max/mean | bound | join: slots moved / min "
        "| join: load moved / min | after join | leave: slots moved / min "
        "| leave: load moved / min | after leave |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.skew:g} | {r.members} | {r.strategy} | {r.max_mean:.3f} | {r.bound:.3f} "
            f"| {cell(r.join)} | {cell(r.leave)} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot", file=sys.stderr)
        return False
    fig, axes = plt.subplots(2, len(MEMBER_COUNTS), figsize=(16, 9), squeeze=False)
    for col, n in enumerate(MEMBER_COUNTS):
        top, bottom = axes[0][col], axes[1][col]
        for i, name in enumerate(STRATEGIES):
            sel = [r for r in rows if r.members == n and r.strategy == name]
            xs = [r.skew for r in sel]
            color = f"C{i}"
            top.plot(xs, [r.max_mean for r in sel], marker="o", color=color, label=name)
            bottom.plot(
                xs, [r.join.load_x() for r in sel], marker="o", color=color, label=f"{name} join"
            )
            bottom.plot(
                xs,
                [r.leave.load_x() for r in sel],
                marker="x",
                linestyle="--",
                color=color,
                label=f"{name} leave",
            )
        first = [r for r in rows if r.members == n and r.strategy == STRATEGIES[0]]
        top.plot(
            [r.skew for r in first], [r.bound for r in first], "k:", label="hottest-slot bound"
        )
        top.set_yscale("log")
        top.set_title(f"{n} members: max/mean load per capacity (fresh group)")
        top.set_xlabel("Zipf s")
        bottom.set_yscale("log")
        bottom.set_title(f"{n} members: load moved / minimum, per join and leave")
        bottom.set_xlabel("Zipf s")
        if col == 0:
            top.legend(fontsize=8)
            bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main() -> None:
    started = time.perf_counter()
    slots = [slot_for_key(f"key-{i}".encode()) for i in range(KEYS)]
    loads = {s: zipf_load(slots, s) for s in SKEWS}
    rows = [
        measure(strategy_named(name).assignor, loads[s], n, s, SEED + n)
        for s in SKEWS
        for n in MEMBER_COUNTS
        for name in STRATEGIES
    ]
    sweep = []
    for s in (0.0, 1.1):
        for n in (16, 64):
            for tol in TOLERANCES:
                row = measure(LoadAwareAssignor(tolerance=tol), loads[s], n, s, SEED + n)
                sweep.append(Row(s, n, f"{tol:g}", row.max_mean, row.bound, row.join, row.leave))
    text = (
        "### All strategies\n\n"
        + table(rows)
        + "\n### load-aware: tolerance sweep\n\n"
        + table(sweep, label="tolerance")
    )
    (RESULTS / "balance.md").write_text(text)
    plotted = plot(rows, RESULTS / "balance.png")
    print(text)
    print(
        f"{len(rows) + len(sweep)} configurations, {TRIALS} joins + {TRIALS} leaves each, "
        f"{time.perf_counter() - started:.1f} s; plot {'written' if plotted else 'skipped'}"
    )


if __name__ == "__main__":
    main()
