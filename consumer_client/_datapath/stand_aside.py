"""A member that cannot read Kafka gives its keys up: docs/protocol.md §7.6.

keyshard's liveness runs over its own channel, so a consumer cut off from Kafka alone
(a firewall, a broken route, a broker listener only it uses) would go on answering Pings
and keep its slots while their records wait. A Kafka group member in that state stops
heartbeating to a coordinator that lives on the broker and loses its partitions after its
session timeout; `StandAside` does the same here. Once no partition asked of Kafka has
been fetched for `timeout_s` (`_datapath.reach`), it stops every range it runs (in-flight
records finish, bounded by the same timeout), hands the exact positions over in a Leave,
drops what it holds, and registers again, as a new member, once Kafka answers a request
for those partitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import TopicPartition as KafkaTP

from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._membership.connector import Membership
from keyshard.consumer_client._membership.member_hooks import MemberHooks
from keyshard.core.model.positions import PositionUpdate, TopicPartition

log = logging.getLogger(__name__)

#: How often the fetches are looked at, and Kafka asked again while standing aside.
CHECK_INTERVAL_S = 0.5
#: How long one request asking whether Kafka answers again may take.
PROBE_TIMEOUT_S = 5.0


class StandAside:
    """Watches whether this member can read Kafka; stands aside while it cannot."""

    def __init__(
        self,
        fetcher: Fetcher,
        hooks: MemberHooks,
        membership: Membership,
        *,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetcher = fetcher
        self.hooks = hooks
        self.membership = membership
        self.timeout_s = timeout_s
        self._clock = clock
        self._aside_since: float | None = None  # None: not standing aside

    def unreadable_for(self) -> float | None:
        """Seconds this member has not been able to read Kafka, once that reached the
        timeout (None: it reads, or has not failed that long): /readyz says so."""
        now = self._clock()
        if self._aside_since is not None:
            return now - self._aside_since + self.timeout_s
        failing = self.fetcher.reach.failing_for(now)
        return failing if failing is not None and failing >= self.timeout_s else None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            now = self._clock()
            self.fetcher.observe_reach(now)
            failing = self.fetcher.reach.failing_for(now)
            if failing is None or failing < self.timeout_s:
                continue
            if not self.membership.registered.is_set():
                continue  # between registrations: nothing to hand over yet
            partitions = sorted(self.fetcher.reach.silences(now))
            await self._let_go(partitions, failing)
            await self._until_readable(partitions)

    async def _let_go(self, partitions: list[TopicPartition], failing: float) -> None:
        self._aside_since = self._clock()
        log.warning(
            "%s: no fetch from Kafka has succeeded for %.1f s (partitions %s): handing its "
            "ranges back and registering again once Kafka answers",
            self.membership.name, failing, ", ".join(f"{t}[{p}]" for t, p in partitions),
        )  # fmt: skip
        owned, positions = self.hooks.held()
        final: PositionUpdate = positions
        if owned:
            try:
                final = await asyncio.wait_for(self.hooks.stop_fetcher(owned), self.timeout_s)
            except TimeoutError:
                # Handlers still running: their records are not in the positions handed
                # over, so the next owners process them again (they are aborted first).
                final = self.hooks.held()[1]
        await self.membership.step_aside(final, self.hooks.session_lost)

    async def _until_readable(self, partitions: list[TopicPartition]) -> None:
        """Ask Kafka for the partitions' ends until it answers, then let the member
        register again."""
        kafka = self.fetcher.kafka
        wanted = [KafkaTP(*tp) for tp in partitions]
        while True:
            try:
                await asyncio.wait_for(kafka.end_offsets(wanted), PROBE_TIMEOUT_S)
                break
            except TimeoutError:
                pass
            except Exception as err:  # aiokafka's errors while the broker is unreachable
                log.debug("%s: Kafka still does not answer: %r", self.membership.name, err)
            await asyncio.sleep(CHECK_INTERVAL_S)
        assert self._aside_since is not None
        log.info(
            "%s: Kafka answers again after %.1f s aside: registering again",
            self.membership.name, self._clock() - self._aside_since,
        )  # fmt: skip
        self._aside_since = None
        self.membership.readable.set()
