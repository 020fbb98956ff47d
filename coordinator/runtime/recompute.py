"""When and where a group's stale target is recomputed.

A recompute is O(members) or worse: ~1.5 s of CPU at 5,000 members. Two rules keep it
from hurting a busy coordinator:

- **When**: a lone change at once; a change that follows another within `quiet_s` (a
  storm of joins) once membership has been quiet for `quiet_s`, so the storm shares one
  recompute instead of paying one per wave, each wave moving what the last one placed;
  no later than `max_defer_s` after the target went stale; and never sooner than the
  last recompute's own duration after it ended.
- **A forming group** (no slot ran on a member since it formed: `GroupState.forming`)
  waits for `idle_quiet_s` of quiet even for its first member, and at most
  `forming_max_defer_s`: Kafka's `group.initial.rebalance.delay.ms`. Nothing runs there
  yet, so waiting loses nothing, while a target granted to the storm's head is cut into
  by the next one, a piece from every member (370 members placed, then 4,600 more
  joined: thousands of StopFetchers). The tail often comes late: connections that
  overflowed the listen queue (at most `somaxconn` = 4096 on Linux) complete only when
  TCP retransmits, 0.2-1.3 s later, and a busy loop accepts in bursts. The price: a lone
  consumer of a new group gets its first grant `idle_quiet_s` later. Registers still in
  flight at the replica (`arriving`: received, not answered; each waits for a partition
  count from Kafka before its member joins) are joins on their way: while there are any,
  a forming group's membership is not quiet. Under load that wait takes seconds, and the
  joins it holds back would otherwise leave a gap that looks like the end of the storm.
- **Where**: in a worker thread, on a frozen snapshot of the inputs (`AssignmentSpec`).
  Inline it would block the loop for its whole duration: no reply read, no timer on time,
  no connection accepted. In a thread the loop keeps its share of the GIL every switch
  interval. The result is adopted on the loop (`targets.target_computed`), tagged with
  the inputs version it was computed from, so a membership change meanwhile simply
  leaves the target stale and schedules the next one.

The handoff order is unaffected: a recompute only changes the target; the runtime's
reconcile then drives revokes before grants.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from keyshard.coordinator.group import targets
from keyshard.coordinator.group.records import TargetComputed
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.strategies.registry import strategy_named

log = logging.getLogger(__name__)
Adopt = Callable[[str, GroupState, TargetComputed], None]
# How long at most a forming group's first target waits for a storm that keeps joining:
# long enough for thousands of members connecting to a busy replica, short against a
# consumer's patience for its first records.
FORMING_MAX_DEFER_S = 10.0


@dataclass
class Schedule:
    stale_since: float  # when the target went stale (the recomputer's timer)
    changed_at: float  # when inputs last changed
    version: int  # inputs_version seen at `changed_at`
    burst: bool  # changes are coming close together: wait for a quiet moment


@dataclass(frozen=True, slots=True)
class Pacing:
    """How long a stale target waits for quiet membership, and at most (module doc)."""

    quiet_s: float = 0.1
    max_defer_s: float = 2.0
    idle_quiet_s: float = 1.5
    forming_max_defer_s: float = FORMING_MAX_DEFER_S

    def due_at(self, schedule: Schedule, *, forming: bool, spaced_until: float) -> float:
        """When the recompute `schedule` waits for may start."""
        if forming:
            quiet = schedule.changed_at + max(self.quiet_s, self.idle_quiet_s)
            latest = schedule.stale_since + max(self.max_defer_s, self.forming_max_defer_s)
        else:
            quiet = schedule.changed_at + (self.quiet_s if schedule.burst else 0.0)
            latest = schedule.stale_since + self.max_defer_s
        return max(min(quiet, latest), spaced_until)


class TargetRecomputer:
    def __init__(
        self,
        adopt: Adopt,
        activity: Activity,
        clock: Callable[[], float],
        pacing: Pacing,
        *,
        timer: Callable[[], float] = time.perf_counter,
        arriving: Callable[[], int] = lambda: 0,
    ) -> None:
        self._adopt = adopt
        self._activity = activity
        self._clock = clock
        self.pacing = pacing
        self._timer = timer  # monotonic seconds: when changes came, how long a recompute took
        self._arriving = arriving  # Registers in flight at the replica (module doc)
        self._pending: dict[str, Schedule] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ended: dict[str, float] = {}
        self._took: dict[str, float] = {}
        self._seen: dict[str, int] = {}  # per group: the inputs_version last seen
        self._changed: dict[str, float] = {}  # and when it changed

    @property
    def scheduled(self) -> set[str]:
        return {group for group, task in self._tasks.items() if not task.done()}

    def stale(self, group: str, state: GroupState) -> None:
        """The group's target is stale (inputs changed): make sure a recompute follows."""
        now = self._timer()
        version = state.inputs_version
        changed = self._seen.get(group) != version
        burst = False
        if changed:
            previous = self._changed.get(group)
            burst = previous is not None and now - previous < self.pacing.quiet_s
            self._seen[group], self._changed[group] = version, now
        pending = self._pending.get(group)
        if pending is None:
            self._pending[group] = Schedule(now, now, version, burst)
        elif changed:
            pending.changed_at, pending.version = now, version
            pending.burst = pending.burst or burst
        running = self._tasks.get(group)
        if running is None or running.done():
            task = asyncio.create_task(self._run(group, state), name=f"recompute-{group}")
            self._tasks[group] = task
            task.add_done_callback(partial(self._finished, group))

    def _finished(self, group: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(group) is task:
            del self._tasks[group]
        if not task.cancelled() and task.exception() is not None:
            log.error("recompute of group %s failed", group, exc_info=task.exception())

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    def due_in(self, group: str, state: GroupState) -> float | None:
        """Seconds until the group's pending recompute may start (<= 0: now), or None
        when none is pending."""
        schedule = self._pending.get(group)
        if schedule is None:
            return None
        now = self._timer()
        forming = state.forming
        if forming and self._arriving():
            schedule.changed_at = now  # joins on their way: not quiet yet
        spaced = self._ended.get(group, 0.0) + self._took.get(group, 0.0)
        return self.pacing.due_at(schedule, forming=forming, spaced_until=spaced) - now

    async def _run(self, group: str, state: GroupState) -> None:
        while (wait := self.due_in(group, state)) is not None:
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            del self._pending[group]
            if not state.members or state.target_version == state.inputs_version:
                continue
            version = state.inputs_version
            spec = targets.assignment_spec(state, self._clock())
            assignor = strategy_named(state.config.assignor).assignor
            began = self._timer()
            assignment = await asyncio.to_thread(assignor.assign, spec)
            ended = self._timer()
            self._ended[group], self._took[group] = ended, ended - began
            self._activity.timed("recompute", ended - began)
            # Adopting may find the inputs changed again: that calls `stale`, which
            # queues the next round for this same loop.
            self._adopt(group, state, targets.target_computed(state, assignment, version))
