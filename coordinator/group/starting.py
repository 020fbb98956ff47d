"""Where a new group starts: at its partitions' first offsets, or at their ends.

A group is new until anything about it is known: positions, members, or members that may
come back. With `OffsetReset.LATEST`, the partitions' ends at the moment the group is
created (read from Kafka by the runtime, which does the I/O) become the group's positions,
recorded like any progress and stored with the group, so nothing decides again later where
it starts. With `OffsetReset.EARLIEST` nothing is recorded: a partition without positions
is read from its first offset. A partition added to a topic afterwards has no positions
and is read from its first offset either way: all of its records came after the group.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.records import PositionsAdvanced
from keyshard.coordinator.group.state import GroupConfig, GroupState, OffsetReset
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position, TopicPartition
from keyshard.core.model.ranges import SlotRange


def is_new(state: GroupState) -> bool:
    """Nothing is known of the group yet: no positions, no members, no pending claims."""
    return not (state.positions or state.members or state.claims)


def needs_partition_ends(config: GroupConfig, state: GroupState | None) -> bool:
    """Whether a Register must read the partitions' ends first: the group (None: not
    created yet) is new and starts at the end."""
    return config.auto_offset_reset is OffsetReset.LATEST and (state is None or is_new(state))


def start_positions(state: GroupState, ends: Mapping[TopicPartition, int]) -> Result:
    """The positions a new group that starts at the end begins from: every slot of each
    partition at its end in `ends`. Nothing when the group is not new any more (another
    member's Register recorded them first) or starts at the first offsets."""
    if not needs_partition_ends(state.config, state):
        return Result()
    every_slot = SlotRange(0, MAX_SLOT)
    updates = tuple((tp, ((every_slot, Position(end)),)) for tp, end in sorted(ends.items()))
    return Result(records=[PositionsAdvanced(updates)])
