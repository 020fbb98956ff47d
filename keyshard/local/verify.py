"""Checking the contract from what actually happened: produced records vs. handler logs.

Used by `keyshard demo` and by the integration tests, so the demo's report and the tests'
assertions are the same computation. Ordering is checked exactly as the contract states
it: a record of key K may be handed to a handler only after every earlier record of K was
acknowledged by someone. Re-deliveries of already-acknowledged records are duplicates,
not order violations.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Produced:
    partition: int
    offset: int
    key: str


@dataclass(frozen=True, slots=True)
class Processed:
    """One handler run: start and end in CLOCK_MONOTONIC ns (comparable across processes)."""

    partition: int
    offset: int
    key: str
    slot: int
    worker: str
    member: str
    t0: int
    t1: int
    topic: str = ""  # the demo worker's own logs name it


@dataclass(slots=True)
class Report:
    produced: int = 0
    processed_unique: int = 0
    handler_runs: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    duplicates: int = 0
    order_violations: list[str] = field(default_factory=list)
    per_worker: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.order_violations


def read_processed(paths: Iterable[Path]) -> list[Processed]:
    events = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by kill -9
            events.append(
                Processed(
                    d["p"], d["o"], d["k"], d["s"], d["w"], d["m"], d["t0"], d["t1"], d.get("t", "")
                )
            )
    return events


def check(produced: list[Produced], processed: list[Processed]) -> Report:
    report = Report(produced=len(produced), handler_runs=len(processed))
    done_offsets = {(e.partition, e.offset) for e in processed}
    report.processed_unique = len(done_offsets & {(p.partition, p.offset) for p in produced})
    report.lost = sorted(
        (p.partition, p.offset) for p in produced if (p.partition, p.offset) not in done_offsets
    )
    report.duplicates = len(processed) - len(done_offsets)
    per_worker: dict[str, int] = defaultdict(int)
    for e in processed:
        per_worker[e.worker] += 1
    report.per_worker = dict(sorted(per_worker.items()))
    report.order_violations = order_violations(produced, processed)
    return report


def order_violations(produced: list[Produced], processed: list[Processed]) -> list[str]:
    offsets_of: dict[tuple[int, str], list[int]] = defaultdict(list)
    for p in produced:
        offsets_of[(p.partition, p.key)].append(p.offset)
    runs_of: dict[tuple[int, str], list[Processed]] = defaultdict(list)
    for e in processed:
        runs_of[(e.partition, e.key)].append(e)
    problems = []
    for lane, runs in runs_of.items():
        expected = sorted(offsets_of.get(lane, []))
        by_start = sorted(runs, key=lambda e: e.t0)
        by_end = sorted(runs, key=lambda e: e.t1)
        acked: set[int] = set()
        end_i = 0
        lowest_i = 0
        for run in by_start:
            while end_i < len(by_end) and by_end[end_i].t1 <= run.t0:
                acked.add(by_end[end_i].offset)
                end_i += 1
            while lowest_i < len(expected) and expected[lowest_i] in acked:
                lowest_i += 1
            lowest_open = expected[lowest_i] if lowest_i < len(expected) else None
            if lowest_open is not None and run.offset > lowest_open:
                problems.append(
                    f"key {lane[1]!r} partition {lane[0]}: offset {run.offset} handed to "
                    f"{run.worker} before offset {lowest_open} was acknowledged"
                )
    return problems
