"""Checking the numbers a member reports before anything counts them.

A member's report is its word, and every consumer of every team holds the same token:
one that says "done up to 2**62" for its ranges would hand them on from there, and
every record in between would be lost for good. So nothing a member reports counts
before it is checked against what the coordinator knows:

- **positions** (a Ping reply, a StopFetcher reply, a Leave, a claim at Register) for a
  topic-partition the group does not read, past the partition's end as Kafka told the
  coordinator, or behind what the group already holds for those slots are refused, and
  the member is fenced with the field named (a partition that has left the group is
  ignored: a report sent before the member learned so is no lie); the rest of the group
  carries on from the last good positions. Honest members never trip these: a member
  reads only what is below the end (the high watermark when it fetched, which only
  grows), and it starts a range from the stored positions and only adds to them. So a
  report past the end is judged only against an end Kafka gave *after* the report
  arrived (`KnownEnds.confirmed`), and one that merely passes the ends known so far is
  first confirmed (`Result.confirm`: the runtime asks Kafka and judges again);
- **high watermarks and fetched windows** past the end are clipped to it, a window's
  counts to its size, and a topic-partition the group does not read refuses the report;
- **completions** (`load`, `busy_records`) count no further than the member's positions
  moved (`counted_completions`): a member cannot say it completed records it has not
  passed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from keyshard.coordinator.group.records import FetchedCounts
from keyshard.coordinator.group.state import GroupState
from keyshard.core.model.positions import (
    Position,
    PositionUpdate,
    RangePositionMap,
    TopicPartition,
)
from keyshard.core.model.ranges import RangeSet, SlotRange

Advanced = tuple[tuple[TopicPartition, tuple[tuple[SlotRange, Position], ...]], ...]
HighWatermarks = tuple[tuple[TopicPartition, int, bool], ...]


@dataclass(frozen=True, slots=True)
class KnownEnds:
    """Partition ends (high watermarks) as the coordinator learned them from Kafka.

    `confirmed`: partitions whose end was read after the report being judged arrived, so
    a report past it is a lie. `unconfirmable`: partitions Kafka did not answer for; a
    report past their end is clipped to it (a subset of what the member says is done,
    true if the member is honest), never refused."""

    ends: Mapping[TopicPartition, int] = field(default_factory=dict)
    confirmed: frozenset[TopicPartition] = frozenset()
    unconfirmable: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A report refused: the field at fault (as on the wire) and why."""

    field: str
    reason: str

    @property
    def message(self) -> str:
        return f"refused {self.field}: {self.reason}"


@dataclass(slots=True)
class CheckedPositions:
    """Positions that passed, clipped to the slots they may describe; the offsets they
    moved (`growth`, a completion credit); or the refusal; or the ends to confirm."""

    advanced: Advanced = ()
    growth: int = 0
    refusal: Refusal | None = None
    confirm: dict[TopicPartition, int] = field(default_factory=dict)


def reads(state: GroupState, tp: TopicPartition) -> bool:
    """Whether the group reads `tp` (its partitions as of the last Register, or any it
    holds positions of)."""
    return tp in state.partitions or tp in state.positions


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}/{tp[1]}"


def _top(position: Position) -> int:
    """The highest offset a position says anything about (exclusive)."""
    return position.acked[-1][1] if position.acked else position.next_offset


def _extent(position: Position) -> int:
    """How many offsets a position says are done."""
    return position.next_offset + sum(b - a for a, b in position.acked)


def clipped_position(position: Position, end: int) -> Position:
    """What `position` says of the offsets below `end` only."""
    intervals = [(0, min(position.next_offset, end))]
    intervals += [(a, min(b, end)) for a, b in position.acked if a < end]
    return Position.from_done(intervals)


def _past_end(
    tp: TopicPartition, offset: int, known: KnownEnds | None
) -> tuple[bool, int | None, bool]:
    """(beyond what is known, the end, confirmed): whether `offset` passes the known end
    of `tp`, that end, and whether it was confirmed after the report arrived."""
    if known is None:
        return False, None, False
    end = known.ends.get(tp)
    if end is not None and offset <= end:
        return False, end, False
    return True, end, tp in known.confirmed


def _united(segments: Iterable[tuple[SlotRange, Position]]) -> RangePositionMap:
    """What a report says of each slot, its segments for the same slots united.

    A claim carries, beside the positions of the ranges a member runs, the final ones of
    ranges it released since it last registered; a range it was given back meanwhile has
    both, the released one older. Each alone may be behind the stored position; what the
    member says of a slot is all of them together."""
    united = RangePositionMap()
    for seg, position in segments:
        for slots, before in united.segments(RangeSet((seg,))):
            united.assign(slots, before.union(position))
    return united


def check_positions(
    state: GroupState,
    positions: PositionUpdate,
    allowed: RangeSet,
    *,
    field: str,
    known: KnownEnds | None,
    partitions: Collection[TopicPartition] = (),
) -> CheckedPositions:
    """The parts of `positions` within `allowed` (slots the member may speak for), once
    checked: a topic-partition the group does not read, or a position behind the stored
    one or past a confirmed end, refuses the whole report. Past an end not confirmed yet,
    the partitions to confirm are returned instead (nothing is applied meanwhile).
    `known` None: ends are not checked (only the pure core's tests do that). `partitions`:
    what the group reads besides what it knows of already (those of the Register carrying
    a claim, to a replica that has just taken the group over)."""
    out = CheckedPositions()
    advanced: list[tuple[TopicPartition, tuple[tuple[SlotRange, Position], ...]]] = []
    for tp, segments in positions.items():
        if tp in state.dropped and tp not in partitions:
            continue  # sent before the member read that the partition left the group
        if tp not in partitions and not reads(state, tp):
            out.refusal = Refusal(
                f"{field}[{_name(tp)}]", f"group {state.group!r} does not read {_name(tp)}"
            )
            return out
        stored = state.position_map(tp)
        said = _united(segments)
        kept: list[tuple[SlotRange, Position]] = []
        growth = 0
        for i, (seg, reported) in enumerate(segments):
            parts = RangeSet((seg,)) & allowed
            if not parts:
                continue  # slots it no longer owns: a stale report, not a lie
            where = f"{field}[{_name(tp)}].ranges[{i}].position"
            position = reported
            clipped = False
            beyond, end, confirmed = _past_end(tp, _top(reported), known)
            if beyond:
                assert known is not None
                if tp in known.unconfirmable:
                    if end is None:
                        continue  # nothing known of the partition: nothing counts
                    position, clipped = clipped_position(reported, end), True
                elif not confirmed:
                    out.confirm[tp] = max(out.confirm.get(tp, 0), _top(reported))
                    continue
                else:
                    wrong = "next_offset" if reported.next_offset > (end or 0) else "acked"
                    out.refusal = Refusal(
                        f"{where}.{wrong}",
                        f"{_top(reported)} is past the end of {_name(tp)} "
                        f"({end if end is not None else 'unknown'}), as Kafka says",
                    )
                    return out
            for part in parts:
                for slots, held in stored.segments(RangeSet((part,))):
                    # (A clipped position may be below what is stored: merged by union,
                    # it lowers nothing, and it says nothing false.)
                    lowest = said.minimum_offset(RangeSet((slots,)))
                    if lowest < held.next_offset and not clipped:
                        out.refusal = Refusal(
                            f"{where}.next_offset",
                            f"{lowest} is behind {held.next_offset}, where "
                            f"slots {slots.start}-{slots.end} of {_name(tp)} already are",
                        )
                        return out
                    growth = max(growth, _extent(held.union(position)) - _extent(held))
                kept.append((part, position))
        if kept:
            advanced.append((tp, tuple(kept)))
        out.growth += growth
    if out.confirm:
        return CheckedPositions(confirm=out.confirm)
    out.advanced = tuple(advanced)
    return out


@dataclass(slots=True)
class CheckedProgress:
    """A Ping reply's other numbers, checked: high watermarks and fetched windows within
    the known ends, counts within their windows; or the refusal; or ends to confirm."""

    high_watermarks: HighWatermarks = ()
    fetched: tuple[FetchedCounts, ...] = ()
    refusal: Refusal | None = None
    confirm: dict[TopicPartition, int] = field(default_factory=dict)


def check_progress(
    state: GroupState,
    high_watermarks: Iterable[tuple[TopicPartition, int, bool]],
    fetched: Iterable[FetchedCounts],
    known: KnownEnds | None,
) -> CheckedProgress:
    out = CheckedProgress()

    def end_for(tp: TopicPartition, offset: int, field_name: str) -> int | None:
        """The offset to count up to (None: wait for a confirmed end, or ignore it)."""
        if tp in state.dropped:
            return None  # sent before the member read that the partition left the group
        if not reads(state, tp):
            out.refusal = out.refusal or Refusal(
                f"{field_name}[{_name(tp)}]", f"group {state.group!r} does not read {_name(tp)}"
            )
            return None
        beyond, end, confirmed = _past_end(tp, offset, known)
        if not beyond:
            return offset
        if confirmed or (known is not None and tp in known.unconfirmable):
            return min(offset, end or 0)
        out.confirm[tp] = max(out.confirm.get(tp, 0), offset)
        return None

    marks = []
    for tp, offset, stable in high_watermarks:
        upto = end_for(tp, offset, "high_watermarks")
        if upto is not None:
            marks.append((tp, upto, stable))
    windows = []
    for tp, start, end, buckets in fetched:
        upto = end_for(tp, end, "fetched")
        if upto is not None and upto > start:
            windows.append((tp, start, upto, within_size(buckets, upto - start)))
    if out.refusal is not None:
        return CheckedProgress(refusal=out.refusal)
    if out.confirm:
        return CheckedProgress(confirm=out.confirm)
    out.high_watermarks, out.fetched = tuple(marks), tuple(windows)
    return out


def within_size(counts: tuple[tuple[int, int], ...], size: int) -> tuple[tuple[int, int], ...]:
    """Per-bucket counts scaled down (pro rata) to at most `size` records in all: a
    window of n offsets holds at most n records."""
    total = sum(c for _, c in counts)
    if total <= size:
        return counts
    return tuple((b, c * size // total) for b, c in counts if c * size // total > 0)


def counted_completions(
    load: tuple[tuple[int, int], ...], busy: tuple[int, int] | None, credit: int
) -> tuple[tuple[tuple[int, int], ...], tuple[int, int] | None]:
    """`load` and `busy` as far as `credit` (offsets the member's positions moved and no
    completion counted yet) covers them: the load scaled down pro rata, busy records cut
    (their handler time stays: a member saying it did more than it passed measures
    slower, never faster)."""
    load = within_size(load, credit)
    if busy is not None:
        busy = (min(busy[0], credit), busy[1])
    return load, busy
