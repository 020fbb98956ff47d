"""What the coordinator's requests do to a consumer (`_membership.member_hooks.MemberHooks`).

One class for both kinds of consumer. A plain consumer reports the positions it has, runs
what it is granted at once, and drains what it is asked to stop. An exactly-once consumer
(`_exactly_once.transactions.TransactionalHooks`) differs at four points only, the
hooks below: it reports committed positions, takes slots over before running them, waits
for a take-over still under way and commits before a stopped range is given back, and
drops its open transaction when the session is lost. Everything else (the order of the
steps around those points) must stay the same for both, so it lives here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._datapath.merge import TopicTransition
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._membership.member_hooks import PingReport, TopicsChange
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.model.ranges import RangeSet


class ConsumerHooks:
    """A plain consumer's answers; subclasses override the `_hooks` only."""

    def __init__(self, progress: ConsumerProgress, fetcher: Fetcher, dispatcher: Dispatcher):
        self._progress = progress
        self._fetcher = fetcher
        self._dispatcher = dispatcher

    # -- hooks ---------------------------------------------------------------------------

    def _reported_positions(self) -> PositionUpdate:
        """The positions the coordinator may store: everything examined minus pending."""
        return self._progress.positions()

    def _settle_before_stop(self, slots: RangeSet) -> list[asyncio.Task[None]]:
        """Called as a stop begins, before the lanes drop `slots`: what must finish first."""
        return []

    async def _after_drain(self, slots: RangeSet) -> None:
        """`slots` are drained; their final positions are taken right after this."""

    async def _forget_session(self) -> None:
        """The session is lost and the lanes are aborted; before fetching may resume."""

    # -- MemberHooks --------------------------------------------------------

    def ping_reply(self) -> PingReport:
        return PingReport(
            self._reported_positions(),
            self._dispatcher.take_load(),
            self._fetcher.high_watermarks(),
            self._progress.take_demand(),
            *self._dispatcher.take_busy(),
        )

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        self._fetcher.grant(slots, positions)

    def topics_changed(self, change: TopicsChange) -> None:
        """Before the StartFetcher that carries it: topics in transition merge their
        partitions' records by timestamp; dropped partitions are fetched no more."""
        if change.transitions:
            self._fetcher.begin_transitions(
                TopicTransition(t.topic, t.counts, t.until_ms) for t in change.transitions
            )
        if change.dropped:
            self._fetcher.drop(change.dropped)

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        """What this consumer still runs and its exact positions (a claim after losing
        the coordinator): ranges already stopping are not claimed, their final positions
        are (the membership keeps them)."""
        return self._progress.running(), self._reported_positions()

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]:
        """Stop dispatching `slots` now; the final positions once they are drained."""
        waiting = self._settle_before_stop(slots)
        self._progress.begin_stop(slots)
        self._dispatcher.lanes.drop(slots)
        return self._finish_stop(slots, waiting)

    async def _finish_stop(
        self, slots: RangeSet, waiting: list[asyncio.Task[None]]
    ) -> PositionUpdate:
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
        await self._dispatcher.lanes.wait_idle(slots)
        await self._after_drain(slots)
        final = self._progress.finish_stop(slots)
        self._fetcher.pause_idle()
        return final

    async def session_lost(self) -> None:
        """docs/protocol.md, §6.1 LOST: stop fetchers, drop queues, forget ownership."""
        self._progress.clear()
        self._fetcher.forget()
        await self._dispatcher.lanes.abort()
        await self._forget_session()
        self._fetcher.room.set()
