"""The streaming member's bookkeeping: handoffs wait for the batches that covered a range."""

from __future__ import annotations

from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.spark_jobs.offsets import StreamOffset, next_offset
from keyshard.spark_jobs.stream_state import SourceState

TP = ("t", 0)
LOW = RangeSet.from_pairs([(0, 32767)])
HIGH = RangeSet.from_pairs([(32768, 65535)])


def plan(state: SourceState, start: StreamOffset, high: int) -> StreamOffset:
    end = next_offset(start, state.active(), {TP: high}, 2)
    state.planned_offset(end)
    return end


def test_a_stop_is_answered_once_the_last_batch_covering_the_range_commits() -> None:
    state = SourceState()
    state.start(RangeSet.full(), {TP: [(SlotRange(0, 65535), Position(5))]})
    first = plan(state, StreamOffset(), 20)
    second = plan(state, first, 40)
    state.committed_offset(first)
    state.begin_stop(HIGH)
    assert state.active()[0].slots == LOW  # no longer planned
    assert not state.stop_ready(HIGH)
    third = plan(state, second, 60)
    assert all(not piece.overlaps(HIGH) for piece in third.pieces)
    state.committed_offset(second)
    assert state.stop_ready(HIGH)
    final = state.finish_stop(HIGH)
    assert final == {TP: [(SlotRange(32768, 65535), Position(40))]}
    assert state.owned == LOW
    assert state.positions() == {TP: [(SlotRange(0, 32767), Position(40))]}


def test_a_stop_with_nothing_planned_is_ready_at_once_with_the_handed_over_positions() -> None:
    state = SourceState()
    state.start(HIGH, {TP: [(SlotRange(32768, 65535), Position.from_done([(0, 7), (9, 12)]))]})
    state.begin_stop(HIGH)
    assert state.stop_ready(HIGH)
    assert state.finish_stop(HIGH) == {
        TP: [(SlotRange(32768, 65535), Position.from_done([(0, 7), (9, 12)]))]
    }
    assert not state.owned


def test_commits_never_go_back_and_a_foreign_checkpoint_counts_until_ours_commit() -> None:
    state = SourceState()
    checkpoint = StreamOffset({TP: _map(30)})
    state.committed_offset(checkpoint)  # restart: Spark hands us the last checkpoint
    assert state.committed == checkpoint
    state.start(RangeSet.full(), {})
    first = plan(state, checkpoint, 50)
    state.committed_offset(first)
    state.committed_offset(checkpoint)  # an older signal changes nothing
    assert state.committed == first
    assert state.positions() == {TP: [(SlotRange(0, 65535), Position(50))]}


def test_a_lost_session_forgets_ownership() -> None:
    state = SourceState()
    state.start(RangeSet.full(), {})
    state.clear()
    assert not state.owned and state.active() == [] and state.positions() == {}


def _map(next_offset: int) -> RangePositionMap:
    return RangePositionMap(Position(next_offset))


def test_an_extension_plans_the_added_partition_from_its_first_offset() -> None:
    """A StartFetcher of the ranges already run with only an added partition's positions
    (coordinator.group.growth): the next batch reads it from 0, the old partition goes on
    from where it was, and a stop hands both back."""
    added = ("t", 1)
    state = SourceState()
    state.start(RangeSet.full(), {TP: [(SlotRange(0, 65535), Position(5))]})
    first = plan(state, StreamOffset(), 20)
    state.committed_offset(first)
    state.start(RangeSet.full(), {added: [(SlotRange(0, 65535), Position(0))]})
    second = next_offset(first, state.active(), {TP: 30, added: 8}, 2)
    state.planned_offset(second)
    assert second.done[TP].minimum_offset() == 30
    assert second.done[added].minimum_offset() == 8
    assert first.at(added).minimum_offset() == 0  # read from its first offset
    state.committed_offset(second)
    state.begin_stop(RangeSet.full())
    assert state.stop_ready(RangeSet.full())
    final = state.finish_stop(RangeSet.full())
    assert final == {
        TP: [(SlotRange(0, 65535), Position(30))],
        added: [(SlotRange(0, 65535), Position(8))],
    }
