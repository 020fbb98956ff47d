"""What a member may ask for: the server's bounds on a Register, as Kafka has them.

Every consumer holding the consumer token can register, in any group, with any numbers
the wire allows. Left unbounded, one of them takes nearly every slot with a huge
capacity, or squats slots with a five-minute session and vanishes (its keys stall for
the whole session, again at every return), or fills a replica with members or groups.
Kafka bounds the same things on its group coordinator (`group.max.size`,
`group.min.session.timeout.ms`, `group.max.session.timeout.ms`); keyshard bounds them per
replica, each with a flag (keyshard.cli.bound_flags) and a default that the tests and
benchmarks fit in (5,000 members in a group, 150 groups on one replica).
"""

from __future__ import annotations

from dataclasses import dataclass

from keyshard.core.protocol.messages import ErrorCode

DEFAULT_MAX_CAPACITY = 1_000
DEFAULT_MIN_SESSION_TIMEOUT_MS = 1_000
DEFAULT_MAX_SESSION_TIMEOUT_MS = 60_000
DEFAULT_MAX_MEMBERS_PER_GROUP = 10_000
DEFAULT_MAX_GROUPS = 1_000
DEFAULT_MAX_SPEED_FACTOR = 4.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """The server's bounds on what members declare and report."""

    # A member's declared capacity counts at most this (it is a weight: more is capped,
    # not refused, so a consumer configured above it still runs).
    max_capacity: int = DEFAULT_MAX_CAPACITY
    # A Register's session timeout must lie within these (Kafka's group.min/max.
    # session.timeout.ms): the longest time its slots wait when it vanishes.
    min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS
    max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS
    # Members in one group (Kafka's group.max.size), and groups one replica serves.
    max_members_per_group: int = DEFAULT_MAX_MEMBERS_PER_GROUP
    max_groups: int = DEFAULT_MAX_GROUPS
    # A member's measured speed counts within this factor of the group's median, either
    # way (coordinator.group.speed).
    max_speed_factor: float = DEFAULT_MAX_SPEED_FACTOR

    def __post_init__(self) -> None:
        if self.min_session_timeout_ms > self.max_session_timeout_ms:
            raise ValueError(
                f"the minimum session timeout ({self.min_session_timeout_ms} ms) is above "
                f"the maximum ({self.max_session_timeout_ms} ms)"
            )
        if self.max_speed_factor < 1:
            raise ValueError(f"max_speed_factor must be >= 1, not {self.max_speed_factor}")

    def capped_capacity(self, capacity: int) -> int:
        return min(capacity, self.max_capacity)

    def session_refusal(self, session_timeout_ms: int) -> tuple[ErrorCode, str] | None:
        """Why a session timeout is refused, or None."""
        low, high = self.min_session_timeout_ms, self.max_session_timeout_ms
        if low <= session_timeout_ms <= high:
            return None
        return (
            ErrorCode.INVALID_SESSION_TIMEOUT,
            f"session_timeout_ms {session_timeout_ms} is outside this coordinator's bounds "
            f"{low}..{high} (--min-session-timeout-ms, --max-session-timeout-ms)",
        )

    def members_refusal(self, group: str, members: int) -> tuple[ErrorCode, str] | None:
        """Why one more member is refused in a group of `members`, or None."""
        if members < self.max_members_per_group:
            return None
        return (
            ErrorCode.GROUP_MAX_SIZE_REACHED,
            f"group {group!r} has {members} members, the most this coordinator allows "
            "(--max-members-per-group)",
        )

    def groups_refusal(self, group: str, groups: int) -> tuple[ErrorCode, str] | None:
        """Why a new group is refused on a replica serving `groups`, or None."""
        if groups < self.max_groups:
            return None
        return (
            ErrorCode.TOO_MANY_GROUPS,
            f"group {group!r} would be one more than the {self.max_groups} groups this "
            "coordinator replica serves at most (--max-groups)",
        )
