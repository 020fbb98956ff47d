"""A revoked permission reaches the members already registered, not only the next Register.

A Kafka consumer whose Read on its group is revoked fails at its next heartbeat or offset
commit (GROUP_AUTHORIZATION_FAILED). Here a member is authorized at Register; this check
asks the authorizer again for every member every interval (the ACL cache's own bound, so
it costs no extra DescribeAcls) and fences each whose principal may no longer read its
group or topics: its ranges move as after any fence, and its next Register is refused
with AUTHORIZATION_FAILED. So positions, and the offsets committed from them, come only
from members whose principal may read the group.

Only a definite refusal fences: ACLs that cannot be read leave every member as it is.
A member without a channel is left to its next Register: it reports nothing meanwhile,
and an ACL naming a host cannot be judged without the member's address. Members of one
group that share a principal and an address are asked about once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.authorization import AuthorizationUnavailable, Authorizer
from keyshard.coordinator.runtime.verdicts import MemberKey
from keyshard.core.protocol.channel import Channel
from keyshard.core.security.identity import IdentityConfigError, parse_principal

log = logging.getLogger(__name__)


class Members(Protocol):
    """What this needs of the runtime (coordinator.runtime.runtime.CoordinatorRuntime)."""

    authorizer: Authorizer
    channels: dict[MemberKey, Channel]

    def group_states(self) -> Mapping[str, GroupState]: ...

    def fence(self, group: str, member_id: str, reason: str) -> bool: ...


async def reauthorize_loop(runtime: Members, interval_s: float) -> None:
    """`reauthorize` every `interval_s`, for as long as the runtime serves: a round that
    fails is said and the next one runs, as revocations must go on reaching members."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await reauthorize(runtime)
        except Exception:
            log.exception("authorizing the members again failed; trying again in %g s", interval_s)


async def reauthorize(runtime: Members) -> int:
    """Fence every member whose principal the authorizer refuses now; how many."""
    fenced = 0
    for group, state in list(runtime.group_states().items()):
        verdicts: dict[tuple[str, str], str | None] = {}
        for member_id, member in list(state.members.items()):
            channel = runtime.channels.get((group, member_id))
            if channel is None:
                continue
            key = (member.principal, channel.peer_host)
            if key not in verdicts:
                try:
                    principal = parse_principal(member.principal)
                    verdicts[key] = await runtime.authorizer.refusal(
                        principal, channel.peer_host, group, state.topics
                    )
                except (AuthorizationUnavailable, IdentityConfigError) as err:
                    log.warning("cannot authorize the members of group %s again: %s", group, err)
                    verdicts[key] = None
            refusal = verdicts[key]
            if refusal is not None and runtime.fence(group, member_id, refusal):
                log.warning("member %s of group %s fenced: %s", member_id, group, refusal)
                fenced += 1
    return fenced
