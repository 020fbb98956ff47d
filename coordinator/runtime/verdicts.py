"""Judging a member late only after reading what it already sent.

Session and drain deadlines fire on the coordinator's clock. On a busy coordinator a
reply that arrived in time can sit unread in the socket, or be read and still wait for
its handler; the runtime's timer verdicts (`TimerVerdicts`) wait for both (`settled`),
then judge again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

from keyshard.coordinator.group import handlers
from keyshard.coordinator.group.effects import DrainTimer, Result, SessionTimer
from keyshard.coordinator.group.records import MemberRemoved
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.timers import Clock
from keyshard.core.protocol.channel import Channel

MemberKey = tuple[str, str]  # (group, member id)


class PendingReplies:
    """Requests per member whose reply the runtime has not handled yet.

    A request is registered from when it is written until its reply has been handled;
    a done future in here is a reply that arrived and still waits for its handler.
    """

    def __init__(self) -> None:
        self._futures: dict[MemberKey, set[asyncio.Future[Any]]] = {}

    @contextlib.contextmanager
    def awaiting(self, group: str, member_id: str, future: asyncio.Future[Any]) -> Iterator[None]:
        key = (group, member_id)
        self._futures.setdefault(key, set()).add(future)
        try:
            yield
        finally:
            futures = self._futures.get(key)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._futures[key]

    @contextlib.contextmanager
    def judging(self, group: str, member_id: str) -> Iterator[None]:
        """A reply read whose handling waits (its report is being checked with Kafka):
        unhandled until the block ends."""
        read: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        read.set_result(None)
        with self.awaiting(group, member_id, read):
            yield

    def unhandled(self, group: str, member_id: str) -> bool:
        return any(f.done() for f in self._futures.get((group, member_id), ()))


async def settled(
    channel: Channel, replies: PendingReplies, group: str, member_id: str, limit_s: float
) -> bool:
    """Wait until everything the member sent so far is read and handled (or the channel
    closed). False when that took longer than `limit_s`: the member kept sending."""
    give_up = time.monotonic() + limit_s
    turns = 0
    while not channel.is_closed:
        if not channel.has_unread_input() and not replies.unhandled(group, member_id):
            return True
        if time.monotonic() >= give_up:
            return False
        turns += 1
        # One loop turn at a time: the read loop and the reply's handler need a few;
        # if they need many, the loop is that busy, so stop spinning on it.
        await asyncio.sleep(0 if turns < 100 else 0.01)
    return True


class TimerVerdicts:
    """A member's expired session or drain deadline, decided only after reading what it
    already sent.

    A timer fires on the coordinator's clock; when the loop is behind, the reply that
    answers it may be sitting unread in the socket, or read and not yet handled. Fencing
    then would punish the member for our lag (and an overloaded coordinator would fence
    hundreds at once, each one more work). So: read and handle everything received so
    far, then judge again with what is known. Bounded by the session timeout, so a member
    that keeps talking without answering is still judged.
    """

    def __init__(
        self,
        *,
        groups: Mapping[str, GroupState],
        channels: Mapping[MemberKey, Channel],
        replies: PendingReplies,
        activity: Activity,
        clock: Clock,
        run: Callable[[str, Result], None],
        spawn: Callable[[Coroutine[Any, Any, Any], str], None],
    ) -> None:
        self._groups = groups
        self._channels = channels
        self._replies = replies
        self._activity = activity
        self._clock = clock
        self._run = run
        self._spawn = spawn

    def fired(self, group: str, state: GroupState, key: SessionTimer | DrainTimer) -> None:
        """The timer `key` of `group` fired: a verdict that removes no member is applied
        at once, as is one on a member whose channel is gone; any other waits for input."""
        result = handlers.timer_fired(state, key=key, now=self._clock())
        channel = self._channels.get((group, key.member_id))
        if not _removes_a_member(result):
            self._run(group, result)
        elif channel is None or channel.is_closed:
            self._expired(group, key, result)
        else:
            self._spawn(self._after_input(group, key, channel), f"judge-{group}-{key.member_id}")

    async def _after_input(
        self, group: str, key: SessionTimer | DrainTimer, channel: Channel
    ) -> None:
        state = self._groups.get(group)
        member = state.members.get(key.member_id) if state else None
        if state is None or member is None:
            return
        limit = member.session_timeout_ms / 1000
        await settled(channel, self._replies, group, key.member_id, limit)
        if self._groups.get(group) is not state:
            return
        result = handlers.timer_fired(state, key=key, now=self._clock())
        if _removes_a_member(result):
            self._expired(group, key, result)
        else:
            self._activity.count("verdict spared")
            self._run(group, result)

    def _expired(self, group: str, key: SessionTimer | DrainTimer, result: Result) -> None:
        expired = "session expired" if isinstance(key, SessionTimer) else "drain expired"
        self._activity.count(expired)
        self._run(group, result)


def _removes_a_member(result: Result) -> bool:
    return any(isinstance(r, MemberRemoved) for r in result.records)
