"""Judging each member's reports in the order they arrived.

A report within the partition ends known so far is judged at once, as it arrives (the
usual case: no I/O). One past them waits for Kafka's answer
(coordinator.runtime.confirmed_ends): the member's liveness counts meanwhile, and its
later reports wait behind it. They must: positions are checked against what is stored
(a report behind it is refused as a lie), so an older report judged after a newer one
would fence an honest member. While a report waits, a session or drain verdict on its
member waits too (coordinator.runtime.verdicts): the reply did arrive in time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.reports import KnownEnds
from keyshard.coordinator.runtime.confirmed_ends import ConfirmedEnds
from keyshard.coordinator.runtime.verdicts import MemberKey, PendingReplies
from keyshard.core.model.positions import TopicPartition

#: A handler call on the state as it is then, with the ends to judge by; None: nothing
#: left to judge (the group was handed over meanwhile).
Judge = Callable[[KnownEnds], Result | None]
Done = Callable[[Result | None], None]
#: Rounds of confirming one report: a second one only when its member's ranges changed
#: while the first was asked; after that, what is still past the ends is clipped.
MAX_ROUNDS = 3


@dataclass(slots=True)
class _Waiting:
    judge: Judge
    done: Done | None
    confirm: dict[TopicPartition, int] | None  # known already: ask before judging


class ReportJudge:
    def __init__(
        self,
        *,
        ends: ConfirmedEnds,
        replies: PendingReplies,
        run: Callable[[str, Result], None],
        heard: Callable[[str, str], None],
        spawn: Callable[[Coroutine[Any, Any, Any], str], None],
    ) -> None:
        self._ends = ends
        self._replies = replies
        self._run = run  # the runtime's apply path: replay, reconcile, effects
        self._heard = heard  # the member proved alive, whatever its report turns out to be
        self._spawn = spawn
        self._queues: dict[MemberKey, deque[_Waiting]] = {}

    def submit(self, group: str, member_id: str, judge: Judge, done: Done | None = None) -> None:
        """Judge a report of `member_id` after those it sent before; `done` is told the
        result once it is applied (None: nothing was)."""
        key = (group, member_id)
        queue = self._queues.get(key)
        if queue is None:
            result = judge(self._ends.known())
            if result is None or not result.confirm:
                self._finish(group, result, done)
                return
            queue = self._queues[key] = deque([_Waiting(judge, done, result.confirm)])
            self._spawn(self._judge_waiting(key, queue), f"reports-{member_id}")
        else:
            queue.append(_Waiting(judge, done, None))
        self._heard(group, member_id)

    async def submitted(self, group: str, member_id: str, judge: Judge) -> Result | None:
        """`submit`, awaiting the result once applied (None: nothing was)."""
        applied: asyncio.Future[Result | None] = asyncio.get_running_loop().create_future()

        def done(result: Result | None) -> None:
            if not applied.done():  # (the caller may have been cancelled meanwhile)
                applied.set_result(result)

        self.submit(group, member_id, judge, done)
        return await applied

    async def verdict(self, judge: Judge) -> Result | None:
        """`judge`'s result, its report confirmed with Kafka if need be, not applied: for
        a report that is not a member's yet (a claim at Register)."""
        return await self._judged(_Waiting(judge, None, None))

    def _finish(self, group: str, result: Result | None, done: Done | None) -> None:
        if result is not None:
            self._run(group, result)
        if done is not None:
            done(result)

    async def _judge_waiting(self, key: MemberKey, queue: deque[_Waiting]) -> None:
        group, member_id = key
        try:
            with self._replies.judging(group, member_id):
                while queue:
                    waiting = queue[0]
                    result = await self._judged(waiting)
                    queue.popleft()
                    self._finish(group, result, waiting.done)
        finally:
            if self._queues.get(key) is queue:
                del self._queues[key]

    async def _judged(self, waiting: _Waiting) -> Result | None:
        confirm = waiting.confirm
        for _ in range(MAX_ROUNDS):
            known = self._ends.known() if confirm is None else await self._ends.confirm(confirm)
            result = waiting.judge(known)
            if result is None or not result.confirm:
                return result
            confirm = result.confirm
        unsure = KnownEnds(self._ends.known().ends, unconfirmable=frozenset(confirm or ()))
        return waiting.judge(unsure)
