"""Judging a member late only after reading what it already sent.

Session and drain deadlines fire on the coordinator's clock. On a busy coordinator a
reply that arrived in time can sit unread in the socket, or be read and still wait for
its handler; the runtime's timer verdicts wait for both (`settled`), then judge again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

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
