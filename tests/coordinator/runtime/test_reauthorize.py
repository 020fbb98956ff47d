"""Members authorized again while they run: a definite refusal fences, ACLs that cannot be
read fence nobody, and a member without a channel waits for its next Register."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyshard.coordinator.group.state import GroupState, Member
from keyshard.coordinator.runtime.authorization import AclFileAuthorizer, AuthorizationUnavailable
from keyshard.coordinator.runtime.reauthorize import reauthorize, reauthorize_loop
from keyshard.core.security.identity import Principal


@dataclass
class Peer:
    peer_host: str


class Unreadable:
    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        raise AuthorizationUnavailable("Kafka is unreachable")

    def describe(self) -> str:
        return "unreadable"


class Runtime:
    def __init__(self, authorizer: Any, state: GroupState) -> None:
        self.authorizer = authorizer
        self.state = state
        self.channels: dict[tuple[str, str], Any] = {}
        self.fenced: list[tuple[str, str]] = []
        self.fenced_one = asyncio.Event()

    def group_states(self) -> Mapping[str, GroupState]:
        return {self.state.group: self.state}

    def fence(self, group: str, member_id: str, reason: str) -> bool:
        self.fenced.append((member_id, reason))
        self.fenced_one.set()
        return True


def group_of(*members: tuple[str, str]) -> GroupState:
    state = GroupState("g", topics=("t",))
    for member_id, principal in members:
        state.members[member_id] = Member(member_id, member_id, 1, 10_000, 0.0, principal=principal)
    return state


ACLS = (
    # Team A may read from its host only; nobody else may read at all.
    "User:a allow Read Group literal g 10.0.0.1\nUser:a allow Read Topic literal t 10.0.0.1\n"
)


async def test_a_refused_member_is_fenced_and_one_without_a_channel_waits(tmp_path: Any) -> None:
    path = tmp_path / "acls"
    path.write_text(ACLS)
    state = group_of(("a-1", "User:a"), ("a-2", "User:a"), ("b-1", "User:b"))
    runtime = Runtime(AclFileAuthorizer(str(path)), state)
    runtime.channels[("g", "a-1")] = Peer("10.0.0.1")
    runtime.channels[("g", "b-1")] = Peer("10.0.0.2")
    # a-2 has no channel (between connections): its host is unknown, so it is not judged.
    assert await reauthorize(runtime) == 1
    assert [member for member, _ in runtime.fenced] == ["b-1"]
    assert "User:b may not join group 'g'" in runtime.fenced[0][1]


async def test_acls_that_cannot_be_read_fence_nobody() -> None:
    runtime = Runtime(Unreadable(), group_of(("b-1", "User:b")))
    runtime.channels[("g", "b-1")] = Peer("10.0.0.2")
    assert await reauthorize(runtime) == 0 and runtime.fenced == []


class FailsOnce:
    """Raises what no authorizer should, once; then refuses everyone."""

    def __init__(self) -> None:
        self.calls = 0

    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug in an authorizer")
        return f"{principal} may not join group {group!r}"

    def describe(self) -> str:
        return "fails once"


async def test_a_round_that_fails_does_not_end_the_loop() -> None:
    runtime = Runtime(FailsOnce(), group_of(("b-1", "User:b")))
    runtime.channels[("g", "b-1")] = Peer("10.0.0.2")
    loop = asyncio.ensure_future(reauthorize_loop(runtime, 0.001))
    try:
        await asyncio.wait_for(runtime.fenced_one.wait(), 5)
    finally:
        loop.cancel()
    assert [member for member, _ in runtime.fenced] == ["b-1"]
