"""What a handler asks the runtime to do, and the `Result` it returns them in.

Effects are values, like records: a handler never sends, closes or arms anything itself.
The runtime carries them out after replaying the records of the same result, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keyshard.coordinator.group.records import Record
from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import ErrorCode


@dataclass(frozen=True, slots=True)
class SendStop:
    member_id: str
    ranges: RangeSet
    epoch: int


@dataclass(frozen=True, slots=True)
class SendStart:
    member_id: str
    ranges: RangeSet
    epoch: int
    positions: PositionUpdate
    # An extension (coordinator.group.growth): `ranges` already run on the member, and
    # this starts them on the partitions in `positions` (added to the group) and stops
    # `dropped` (no longer the group's). No grant: nothing to acknowledge.
    extends: bool = False
    dropped: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class CloseMember:
    member_id: str
    code: ErrorCode
    message: str


# ---- timer keys: which timer, as a value the runtime dispatches on with `match` -------


@dataclass(frozen=True, slots=True)
class SessionTimer:
    """The member's session may have run out: re-armed by every reply it sends."""

    member_id: str


@dataclass(frozen=True, slots=True)
class DrainTimer:
    """The member's earliest StopFetcher drain deadline."""

    member_id: str


@dataclass(frozen=True, slots=True)
class QuarantineTimer:
    """The ranges of a lost member may move: it must have stopped by now."""

    member_id: str


@dataclass(frozen=True, slots=True)
class HoldTimer:
    """Grants held for a target that has not placed every member may wait no longer."""


@dataclass(frozen=True, slots=True)
class BalanceTimer:
    """The periodic load check of a strategy that places by load."""


TimerKey = SessionTimer | DrainTimer | QuarantineTimer | HoldTimer | BalanceTimer


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Arm `key` at `at`; arming a key again replaces its deadline (how sessions renew)."""

    key: TimerKey
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: TimerKey


Effect = SendStop | SendStart | CloseMember | SetTimer | CancelTimer


@dataclass(slots=True)
class Result:
    records: list[Record] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    error: tuple[ErrorCode, str] | None = None
    # Nothing is decided yet: a report passes these partition ends as known so far, and
    # is judged again once Kafka has said where they are (coordinator.group.reports).
    confirm: dict[TopicPartition, int] = field(default_factory=dict)
