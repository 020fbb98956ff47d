"""Where a new group starts (`--auto-offset-reset`, per group `--group-auto-offset-reset`),
on a real broker with real consumer processes: records produced before the group exists
are processed by an `earliest` group and skipped by a `latest` one; records produced after
are processed by both; and a `latest` group that has positions resumes from them, never
from the end again."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

from harness import CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.local.verify import Processed, Produced

pytestmark = [
    pytest.mark.integration,
    pytest.mark.coordinator_args("--group-auto-offset-reset", "late=latest"),
]
BEFORE, AFTER, AWAY = 300, 200, 100  # records produced before, after, and while late is gone


def offsets(records: Iterable[Produced | Processed]) -> set[tuple[int, int]]:
    return {(r.partition, r.offset) for r in records}


async def without_members(coordinator: CoordinatorProcess, group: str) -> bool:
    view = await coordinator.group(group)
    return view is not None and view["members"] == []


async def test_latest_skips_what_came_before_the_group_and_earliest_does_not(
    coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    await create_topic(coordinator.bootstrap, partitions=2)
    before = await produce(coordinator.bootstrap, BEFORE, 50)
    ends = {p: 1 + max(r.offset for r in before if r.partition == p) for p in (0, 1)}
    groups = {}
    for name in ("early", "late"):
        (tmp_path / name).mkdir()
        groups[name] = Workers(coordinator, tmp_path / name, group=name)
    try:
        for name, workers in groups.items():
            workers.spawn(f"{name}-0")
            await wait_for(functools.partial(coordinator.settled, 1, name), 30, f"{name} settled")
        after = await produce(coordinator.bootstrap, AFTER, 50, start=BEFORE)
        everything = offsets([*before, *after])
        early, late = groups["early"], groups["late"]
        await wait_for(lambda: early.unique() >= BEFORE + AFTER, 60, "early: every record")
        await wait_for(lambda: late.unique() >= AFTER, 60, "late: the records after")
        assert offsets(early.processed()) == everything
        assert offsets(late.processed()) == offsets(after)
        view = await coordinator.group("late")
        assert view is not None and view["config"]["auto_offset_reset"] == "latest"
        assert (await coordinator.group("early") or {})["config"]["auto_offset_reset"] == "earliest"

        # Gone and back: the group has positions, so it resumes from them and processes
        # what was produced meanwhile; the partitions' ends are not read again.
        late.stop("late-0")
        await wait_for(lambda: without_members(coordinator, "late"), 30, "late without members")
        away = await produce(coordinator.bootstrap, AWAY, 50, start=BEFORE + AFTER)
        late.spawn("late-1")
        await wait_for(lambda: late.unique() >= AFTER + AWAY, 60, "late: what came meanwhile")
        assert offsets(late.processed()) == offsets([*after, *away])
        assert all(e.offset >= ends[e.partition] for e in late.processed())
        started = coordinator.read_log().count("new group late starts at the partitions' ends")
        assert started == 1
    finally:
        for workers in groups.values():
            workers.stop_all()
