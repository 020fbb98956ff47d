"""Making positions durable: group commit of the range position maps to the state store.

A StartFetcher may leave only once the positions it carries are stored (so a range
always starts from a stored position, even if the coordinator dies right after), and
progress is persisted periodically besides. Every caller waits for the one write in
flight, or the next one if that started before the version it needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from coordinator.group.state import GroupState
from coordinator.runtime.activity import Activity
from coordinator.storage.base import StateStore

log = logging.getLogger(__name__)
Spawn = Callable[[Coroutine[Any, Any, Any], str], None]


class PositionWriter:
    def __init__(
        self, store: StateStore, groups: dict[str, GroupState], activity: Activity, spawn: Spawn
    ) -> None:
        self.store = store
        self.groups = groups
        self.activity = activity
        self.spawn = spawn
        self.flushed: dict[str, int] = {}  # per group: positions_version known stored
        self.writes: dict[str, asyncio.Task[None]] = {}  # per group: the write in flight
        self.waiting = 0  # callers waiting for a write (a gauge for the activity line)

    def durable(self, group: str, version: int) -> None:
        """Positions up to `version` are stored already (replayed from the store, or a new
        group with none)."""
        self.flushed[group] = max(self.flushed.get(group, -1), version)

    async def flush(self, group: str, needed: int | None = None) -> None:
        """Make the positions as of this call (or version `needed`) durable (group commit).

        Callers waiting while a write is in flight are all served by the next one: each
        needs the version it saw on arrival, not the newest, or a burst of StartFetchers
        would each wait for a write of its own while pings keep moving positions on.
        They wait on the write itself, not in a lock's queue: thousands of waiters then
        resume in one loop turn when it lands instead of one per turn (a convoy that
        held StartFetchers for seconds in a join storm).
        """
        state = self.groups.get(group)
        if state is None:
            return
        if needed is None:
            needed = state.positions_version
        self.waiting += 1
        try:
            while self.flushed.get(group, -1) < needed:
                write = self.writes.get(group)
                if write is None or write.done():
                    write = self.writes[group] = asyncio.create_task(
                        self._write(group, state), name=f"flush-{group}"
                    )
                    # Its waiters see a failure; this keeps one nobody waits for from
                    # being reported as never retrieved.
                    write.add_done_callback(lambda t: t.cancelled() or t.exception())
                await asyncio.shield(write)
        finally:
            self.waiting -= 1

    async def _write(self, group: str, state: GroupState) -> None:
        version = state.positions_version
        began = time.perf_counter()
        snapshot = {tp: pmap.copy() for tp, pmap in state.positions.items()}
        await self.store.save(group, snapshot)
        self.durable(group, version)
        self.activity.timed("flush", time.perf_counter() - began)
        self.spawn(self.store.commit_low_watermarks(group, snapshot), f"commit-{group}")

    async def flush_all(self) -> None:
        for group in list(self.groups):
            await self.flush(group)

    async def run(self, interval: float) -> None:
        """Persist progress every `interval`, or less often when a flush itself is slow
        (thousands of members: the maps are large): at most about a tenth of the time
        goes to it. A StartFetcher still waits for its positions, whatever this does."""
        took = 0.0
        while True:
            await asyncio.sleep(max(interval, 9 * took))
            began = time.perf_counter()
            try:
                await self.flush_all()
            except Exception as err:
                log.error("could not persist positions: %s", err)
            took = time.perf_counter() - began
