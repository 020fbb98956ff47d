"""Partition ends as Kafka told the coordinator: what a member's report is judged against.

The ends known so far are a lower bound (partitions only grow), so a report within them
passes at once. A report past them is judged only against ends Kafka gives *after* it
arrived (`confirm`): in a live stream members are always a little past the last answer,
and an honest member must never be fenced for that. Reports arriving together share one
question to Kafka (one in flight at a time, for every partition asked meanwhile).

An answer that still falls short is asked again a few times before it stands: a new
partition leader can briefly answer a lower high watermark than the old one did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import MappingProxyType

from keyshard.coordinator.group.reports import KnownEnds
from keyshard.coordinator.storage.base import ClusterMetadata
from keyshard.core.model.positions import TopicPartition

log = logging.getLogger(__name__)
#: Waits before asking again while an answer falls short of a report.
ASK_AGAIN_AFTER_S = (0.5, 1.0)


class ConfirmedEnds:
    def __init__(
        self, metadata: ClusterMetadata, ask_again_after_s: tuple[float, ...] = ASK_AGAIN_AFTER_S
    ) -> None:
        self.metadata = metadata
        self.ask_again_after_s = ask_again_after_s
        self._ends: dict[TopicPartition, int] = {}
        self._known = KnownEnds(MappingProxyType(self._ends))
        self._asked: dict[TopicPartition, int] = {}  # for the next question
        self._waiting: list[asyncio.Future[frozenset[TopicPartition]]] = []
        self._asking: asyncio.Task[None] | None = None

    def known(self) -> KnownEnds:
        """The ends learned so far (a live view, confirming nothing)."""
        return self._known

    def learned(self, ends: Mapping[TopicPartition, int]) -> None:
        """Ends read from Kafka elsewhere (a new group's start): ends only grow."""
        for tp, end in ends.items():
            self._ends[tp] = max(self._ends.get(tp, 0), end)

    async def confirm(self, needed: Mapping[TopicPartition, int]) -> KnownEnds:
        """Ask Kafka where the partitions of `needed` (tp -> the offset a report names)
        end, in a question that starts after this call; asked again while an answer
        falls short. Partitions Kafka did not answer for come back `unconfirmable`."""
        failed: frozenset[TopicPartition] = frozenset()
        for wait in (0.0, *self.ask_again_after_s):
            if wait:
                await asyncio.sleep(wait)
            failed = await self._ask(needed)
            short = [
                tp for tp, offset in needed.items()
                if tp not in failed and self._ends.get(tp, 0) < offset
            ]  # fmt: skip
            if not short:
                break
        confirmed = frozenset(needed) - failed
        return KnownEnds(self._known.ends, confirmed=confirmed, unconfirmable=failed)

    async def _ask(self, needed: Mapping[TopicPartition, int]) -> frozenset[TopicPartition]:
        for tp, offset in needed.items():
            self._asked[tp] = max(self._asked.get(tp, 0), offset)
        answer: asyncio.Future[frozenset[TopicPartition]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting.append(answer)
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._questions(), name="confirm-ends")
        return await asyncio.shield(answer)

    async def _questions(self) -> None:
        """One question at a time, each for everything asked before it started."""
        while self._waiting:
            asked, self._asked = self._asked, {}
            waiting, self._waiting = self._waiting, []
            try:
                answer = await self.metadata.high_watermarks(sorted(asked), asked)
            except Exception as err:
                log.warning("could not read partition ends from Kafka: %s", err or repr(err))
                answer = {}
            self.learned(answer)
            failed = frozenset(tp for tp in asked if tp not in answer)
            for future in waiting:
                if not future.done():
                    future.set_result(failed)
