"""What a handler asks the runtime to do, and the `Result` it returns them in.

Effects are values, like records: a handler never sends, closes or arms anything itself.
The runtime carries them out after replaying the records of the same result, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.group.records import Record
from coordinator.model.positions import PositionUpdate
from coordinator.model.ranges import RangeSet
from coordinator.protocol.messages import ErrorCode


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
    # Send only once positions up to this version are durable (GroupState.handoff_version).
    durable_version: int = 0


@dataclass(frozen=True, slots=True)
class CloseMember:
    member_id: str
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class SetTimer:
    key: str
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: str


Effect = SendStop | SendStart | CloseMember | SetTimer | CancelTimer


@dataclass(slots=True)
class Result:
    records: list[Record] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    error: tuple[ErrorCode, str] | None = None


def session_key(member_id: str) -> str:
    return f"session:{member_id}"


def drain_key(member_id: str) -> str:
    return f"drain:{member_id}"


def quarantine_key(member_id: str) -> str:
    return f"quarantine:{member_id}"


GRACE_KEY = "grace"
BALANCE_KEY = "balance"
