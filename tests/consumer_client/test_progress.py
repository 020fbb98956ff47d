"""ConsumerProgress: the fetch filter and the positions it reports.

A partition is simulated as a log of slots (`log[offset]` is the slot of the record at
`offset`). The central property: positions reported for a range, handed to a NEW consumer,
make it admit exactly the records that were not acknowledged - no loss, no duplicates.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.core.model.positions import Position, PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet, SlotRange

TP = ("t", 0)
N_SLOTS = 8


def admit(progress: ConsumerProgress, tp: TopicPartition, offset: int, slot: int) -> bool:
    """What the dispatcher does with a fetched record: the fetch filter, then pending."""
    partition = progress.partitions.get(tp)
    if partition is None or not partition.accept(offset, slot):
        return False
    partition.pending[offset] = slot
    return True


def slots_of(rs: RangeSet) -> list[int]:
    return [s for r in rs for s in range(r.start, r.end + 1)]


def start_map(slots: RangeSet, by_slot: dict[int, Position]) -> PositionUpdate:
    """What the coordinator sends: one segment per slot of the grant."""
    return {TP: [(SlotRange(s, s), by_slot.get(s, Position())) for s in slots_of(slots)]}


def feed(p: ConsumerProgress, log: list[int], start: int, end: int | None = None) -> list[int]:
    """Hand records [start, end) to the filter as the fetcher would; returns admitted offsets."""
    end = len(log) if end is None else end
    return [o for o in range(start, end) if admit(p, TP, o, log[o])]


def expected_admitted(
    log: list[int], slots: RangeSet, start: dict[int, Position], acked: set[int]
) -> list[int]:
    return [
        o
        for o, s in enumerate(log)
        if s in slots and not start.get(s, Position()).is_done(o) and o not in acked
    ]


def fresh_take_over(slots: RangeSet, positions: PositionUpdate, log: list[int]) -> list[int]:
    """A new consumer starts `slots` from `positions` and reads the whole remaining log."""
    nxt = ConsumerProgress()
    seeks = nxt.add_grant(slots, positions)
    return feed(nxt, log, seeks[TP])


def test_admit_skips_foreign_and_done_records() -> None:
    p = ConsumerProgress()
    start = Position(5, ((8, 10),))
    log = [o % N_SLOTS for o in range(24)]
    seeks = p.add_grant(RangeSet.from_pairs([(0, 3)]), {TP: [(SlotRange(0, 3), start)]})
    assert seeks == {TP: 5}
    assert feed(p, log, 0) == [o for o in range(10, 24) if o % N_SLOTS < 4]
    assert not admit(p, TP, 12, 4)  # already behind the cursor
    assert not admit(p, ("other", 0), 30, 0)  # unknown partition
    assert p.pending_count() == 6  # offsets 10, 11, 16, 17, 18, 19
    assert p.owned == RangeSet.from_pairs([(0, 3)])


def test_out_of_order_acks_become_acked_intervals() -> None:
    p = ConsumerProgress()
    slots = RangeSet.from_pairs([(0, 0)])
    p.add_grant(slots, {TP: [(SlotRange(0, 0), Position(100))]})
    log = [0] * 110
    assert feed(p, log, 100) == list(range(100, 110))
    for o in (101, 102, 105, 109):
        p.ack(TP, o)
    p.ack(TP, 999)  # unknown offsets are ignored
    ((seg, pos),) = p.positions()[TP]
    assert seg == SlotRange(0, 0)
    assert pos == Position(100, ((101, 103), (105, 106), (109, 110)))
    p.ack(TP, 100)
    assert p.positions()[TP][0][1] == Position(103, ((105, 106), (109, 110)))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], RangeSet, dict[int, Position]]:
    log = draw(st.lists(st.integers(0, N_SLOTS - 1), max_size=60))
    chosen = draw(st.sets(st.integers(0, N_SLOTS - 1), min_size=1))
    slots = RangeSet.from_pairs((s, s) for s in chosen)
    done = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 10)), max_size=3)
    start = {s: Position.from_done((a, a + n) for a, n in draw(done)) for s in range(N_SLOTS)}
    return log, slots, start


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False), st.integers(0, 60))
def test_handoff_loses_nothing_and_duplicates_nothing(
    sc: tuple[list[int], RangeSet, dict[int, Position]], rng: random.Random, fetched: int
) -> None:
    log, slots, start = sc
    a = ConsumerProgress()
    seeks = a.add_grant(slots, start_map(slots, start))
    assert seeks[TP] == min(start[s].next_offset for s in slots_of(slots))
    admitted = feed(a, log, seeks[TP], min(fetched, len(log)))
    # admitted: owned and not done by the previous owner, each once
    assert admitted == sorted(set(admitted))
    assert admitted == [o for o in expected_admitted(log, slots, start, set()) if o < fetched]
    acked = set(rng.sample(admitted, rng.randint(0, len(admitted))))
    for o in rng.sample(sorted(acked), len(acked)):
        a.ack(TP, o)
    assert a.pending_count() == len(admitted) - len(acked)

    # stop part of the slots (all of them, sometimes), keep the rest
    all_slots = [s for s in slots_of(slots)]
    stop = RangeSet.from_pairs(
        (s, s) for s in rng.sample(all_slots, rng.randint(1, len(all_slots)))
    )
    kept = slots - stop
    a.begin_stop(stop)
    final = a.finish_stop(stop)
    assert RangeSet(seg for seg, _ in final[TP]) == stop
    assert fresh_take_over(stop, final, log) == expected_admitted(log, stop, start, acked)
    assert a.owned == kept
    if kept:
        rest = a.positions(kept)
        assert fresh_take_over(kept, rest, log) == expected_admitted(log, kept, start, acked)
    else:
        assert a.positions() == {}


def test_records_fetched_while_stopping_are_not_lost() -> None:
    """StopFetcher: begin_stop(slots), in-flight work drains, then finish_stop. Meanwhile
    the fetcher keeps reading the partition for the other slots (the dispatcher keeps
    filtering them, as `admit` does here). A record of a stopping slot read in that window
    is - correctly - not dispatched; it must then not be reported as done either, or
    nobody ever processes it."""
    p = ConsumerProgress()
    slots = RangeSet.from_pairs([(0, 1)])
    p.add_grant(slots, {TP: [(SlotRange(0, 1), Position(0))]})
    log = [0, 1, 0, 1, 0, 1]
    assert feed(p, log, 0, 2) == [0, 1]
    p.ack(TP, 0)
    p.ack(TP, 1)
    stopping = RangeSet.from_pairs([(1, 1)])
    p.begin_stop(stopping)
    assert feed(p, log, 2) == [2, 4]  # slot 1 (offsets 3, 5) is no longer dispatched
    final = p.finish_stop(stopping)
    assert fresh_take_over(stopping, final, log) == [3, 5], f"final positions: {final}"


def test_rewind_for_a_lower_grant() -> None:
    p = ConsumerProgress()
    log = [o % N_SLOTS for o in range(48)]
    g1, g2 = RangeSet.from_pairs([(0, 3)]), RangeSet.from_pairs([(4, 7)])
    assert p.add_grant(g1, {TP: [(SlotRange(0, 3), Position(10))]}) == {TP: 10}
    first = feed(p, log, 10, 30)
    assert first == [o for o in range(10, 30) if log[o] < 4]
    for o in first[::2]:
        p.ack(TP, o)
    generation = p.partitions[TP].generation
    # a grant whose position is below the cursor: the fetcher must seek back
    assert p.add_grant(g2, {TP: [(SlotRange(4, 7), Position(5))]}) == {TP: 5}
    assert p.partitions[TP].generation == generation + 1
    second = feed(p, log, 5)
    # g1 does not see its records again; g2 starts at 5; g1 continues from 30
    assert second == [o for o in range(5, 48) if log[o] >= 4 or o >= 30]
    # a grant above the cursor does not move the fetcher
    assert p.add_grant(RangeSet.from_pairs([(9, 9)]), {TP: [(SlotRange(9, 9), Position(60))]}) == {}
    # positions of both grants still hand over exactly the unacknowledged records
    acked = set(first[::2])
    for grant, start in ((g1, 10), (g2, 5)):
        pos = p.positions(grant)
        want = [o for o in range(start, 48) if log[o] in grant and o not in acked]
        assert fresh_take_over(grant, pos, log) == want


@settings(max_examples=150, deadline=None)
@given(scenarios(), scenarios(), st.randoms(use_true_random=False), st.integers(0, 60))
def test_two_grants_with_rewind_hand_over_exactly(
    sc1: tuple[list[int], RangeSet, dict[int, Position]],
    sc2: tuple[list[int], RangeSet, dict[int, Position]],
    rng: random.Random,
    fetched: int,
) -> None:
    """Grant 1, read and ack some; grant 2 (maybe below the cursor: rewind), read on and
    ack some more; then hand everything over: exactly the unacknowledged records remain."""
    log, g1, start = sc1
    _, g2_raw, start2 = sc2
    g2 = g2_raw - g1
    start.update({s: start2[s] for s in slots_of(g2)})
    a = ConsumerProgress()
    acked: set[int] = set()
    seen: list[int] = []

    def read(frm: int, to: int) -> None:
        got = feed(a, log, frm, to)
        seen.extend(got)
        for o in rng.sample(got, rng.randint(0, len(got))):
            a.ack(TP, o)
            acked.add(o)

    seek = a.add_grant(g1, start_map(g1, start))[TP]
    read(seek, min(fetched, len(log)))
    if g2:
        cursor = a.partitions[TP].cursor
        seek2 = a.add_grant(g2, start_map(g2, start)).get(TP, cursor)
        read(seek2, len(log))
    else:
        read(a.partitions[TP].cursor, len(log))
    owned = g1 | g2
    assert sorted(seen) == sorted(set(seen)), "a record was dispatched twice"
    final = a.finish_stop(owned)
    assert a.owned == RangeSet()
    assert fresh_take_over(owned, final, log) == expected_admitted(log, owned, start, acked)
    # the partition has no grants left: a new grant seeks to its own position
    again = a.add_grant(g1, start_map(g1, {}))
    assert again == {TP: 0}


def test_demand_counts_every_examined_record_once_owned_or_not() -> None:
    """What a Ping reply reports as fetched: each offset once per consumer, owned or not,
    in windows that follow one another; a rewind re-examines without counting again."""
    p = ConsumerProgress()
    slot_a, slot_b = 0, 1 << 10  # load buckets 0 and 64
    log = [slot_a if o % 4 else slot_b for o in range(40)]
    p.add_grant(RangeSet.from_pairs([(0, 15)]), {TP: [(SlotRange(0, 15), Position(10))]})
    assert p.take_demand() == []  # nothing examined yet
    feed(p, log, 10, 30)
    (window,) = p.take_demand()
    assert (window.tp, window.start, window.end) == (TP, 10, 30)
    assert window.buckets == {0: 15, 64: 5}  # bucket 64 is not owned: still demand
    # a grant further back: the partition is re-read from 5
    p.add_grant(
        RangeSet.from_pairs([(slot_b, slot_b)]), {TP: [(SlotRange(slot_b, slot_b), Position(5))]}
    )
    feed(p, log, 5, 40)
    (window,) = p.take_demand()
    assert (window.start, window.end, window.buckets) == (30, 40, {0: 8, 64: 2})
    assert p.take_demand() == []


def test_demand_windows_do_not_claim_offsets_never_read() -> None:
    """A partition all of whose grants went away, granted again further on: the next
    window starts where reading starts, not where it stopped before."""
    p = ConsumerProgress()
    log = [0] * 100
    slots = RangeSet.from_pairs([(0, 15)])
    p.add_grant(slots, {TP: [(SlotRange(0, 15), Position(0))]})
    feed(p, log, 0, 10)
    assert [(w.start, w.end) for w in p.take_demand()] == [(0, 10)]
    p.begin_stop(slots)
    p.finish_stop(slots)
    p.add_grant(slots, {TP: [(SlotRange(0, 15), Position(50))]})
    feed(p, log, 50, 60)
    assert [(w.start, w.end) for w in p.take_demand()] == [(50, 60)]
