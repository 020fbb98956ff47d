"""The merge gate (consumer_client._datapath.merge): records of a topic in transition are
admitted in timestamp order across its partitions, each only once every partition it
waits on was fetched past its timestamp."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.merge import MergeGate, TopicTransition

UNTIL = 1_000


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int


def chunk(partition: int, records: list[Rec], topic: str = "t") -> Chunk:
    return Chunk((topic, partition), 1, 1, list(records))


def admitted(chunks: list[Chunk]) -> list[tuple[int, int]]:
    """(timestamp, partition) of each record, in admission order."""
    return [(r.timestamp, c.tp[1]) for c in chunks for r in c.records]


def test_waits_on_a_multiple_only_old_partitions() -> None:
    t = TopicTransition("t", (2, 4), UNTIL)
    assert list(t.waits_on(0)) == [] and list(t.waits_on(1)) == []
    assert list(t.waits_on(2)) == [0, 1] and list(t.waits_on(3)) == [0, 1]
    t = TopicTransition("t", (2, 3), UNTIL)
    assert set(t.waits_on(0)) == {1, 2} and set(t.waits_on(2)) == {0, 1}


def test_a_new_partition_waits_until_old_ones_are_fetched_past_it() -> None:
    gate = MergeGate()
    gate.begin([TopicTransition("t", (2, 4), UNTIL)])
    assert gate.track([("t", p) for p in range(4)]) == []
    # The new partition's record at 100 waits for partitions 0 and 1.
    assert gate.feed(chunk(2, [Rec(0, 100)])) == []
    assert gate.held == 1
    assert gate.waited_on() == {("t", 0), ("t", 1)}
    # Old partitions' records flow at once (keys do not move between them).
    assert admitted(gate.feed(chunk(0, [Rec(0, 90)]))) == [(90, 0)]
    assert admitted(gate.feed(chunk(1, [Rec(0, 150)]))) == [(150, 1)]
    assert gate.held == 1  # partition 0 not past 100 yet
    assert admitted(gate.caught_up(("t", 0), 120)) == [(100, 2)]
    assert gate.held == 0


def test_the_transition_ends_once_every_partition_is_past_its_window() -> None:
    gate = MergeGate()
    gate.begin([TopicTransition("t", (2, 4), UNTIL)])
    gate.track([("t", p) for p in range(4)])
    gate.feed(chunk(3, [Rec(0, 500)]))
    for p in range(3):
        gate.caught_up(("t", p), UNTIL + 1)
    assert gate.merging("t")
    gate.caught_up(("t", 3), UNTIL + 1)
    assert not gate.merging("t")
    assert [t.topic for t in gate.ended] == ["t"]
    assert gate.feed(chunk(2, [Rec(1, 5)])) == [chunk(2, [Rec(1, 5)])]  # flows as fetched


def test_a_rewound_partition_lets_go_of_what_it_held() -> None:
    gate = MergeGate()
    gate.begin([TopicTransition("t", (2, 3), UNTIL)])
    gate.track([("t", p) for p in range(3)])
    gate.feed(chunk(2, [Rec(0, 100), Rec(1, 110)]))
    assert gate.held == 2
    gate.rewound(("t", 2))
    assert gate.held == 0 and not gate.holding(("t", 2))


def test_the_bytes_held_follow_the_records_into_the_chunks_let_out() -> None:
    """What the gate holds counts in the memory budget as waiting: each record carries an
    even share of its chunk's bytes, out into the chunks it admits, or away with a
    rewind."""
    gate = MergeGate()
    gate.begin([TopicTransition("t", (2, 4), UNTIL)])
    gate.track([("t", p) for p in range(4)])
    held = Chunk(("t", 2), 1, 1, [Rec(0, 100), Rec(1, 105)], size=300)
    assert gate.feed(held) == [] and gate.held_bytes == 300
    gate.feed(Chunk(("t", 3), 1, 1, [Rec(0, 250)], size=70))
    assert gate.held_bytes == 370
    gate.feed(Chunk(("t", 0), 1, 1, [Rec(0, 200)], size=10))  # out at once: 0 waits for none
    (out,) = gate.caught_up(("t", 1), 300)
    assert (out.tp, out.size, gate.held_bytes) == (("t", 2), 300, 70)
    gate.rewound(("t", 3))
    assert gate.held_bytes == 0


# Fetches of three partitions, each a run of records with nondecreasing timestamps per
# partition (Kafka's LogAppendTime, or one producer's CreateTime), interleaved at random.
_partition_runs = st.lists(
    st.lists(st.integers(0, 40), min_size=0, max_size=12).map(sorted), min_size=3, max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    runs=_partition_runs,
    counts=st.sampled_from([(2, 3), (1, 3), (1, 2, 3)]),
    data=st.data(),
)
def test_any_interleaving_admits_in_timestamp_order_under_the_watermark_rule(
    runs: list[list[int]], counts: tuple[int, ...], data: st.DataObject
) -> None:
    transition = TopicTransition("t", counts, 10_000)  # never ends in this test
    gate = MergeGate()
    gate.begin([transition])
    gate.track([("t", p) for p in range(3)])
    # Fetch order: chunks of each partition in order, the partitions interleaved.
    cursors = [0, 0, 0]
    watermark = [-(2**63)] * 3  # fetched past: the highest timestamp fetched
    out: list[tuple[int, int]] = []
    fed: list[tuple[int, int]] = []

    def check(new: list[tuple[int, int]]) -> None:
        for ts, p in new:
            for q in transition.waits_on(p):
                # Admitted only once q was fetched past it...
                assert watermark[q] > ts, (ts, p, q, watermark)
        out.extend(new)

    while any(cursors[p] < len(runs[p]) for p in range(3)):
        choices = [p for p in range(3) if cursors[p] < len(runs[p])]
        p = data.draw(st.sampled_from(choices))
        size = data.draw(st.integers(1, len(runs[p]) - cursors[p]))
        stamps = runs[p][cursors[p] : cursors[p] + size]
        records = [Rec(cursors[p] + i, ts) for i, ts in enumerate(stamps)]
        cursors[p] += size
        watermark[p] = max(watermark[p], stamps[-1])
        fed += [(ts, p) for ts in stamps]
        check(admitted(gate.feed(chunk(p, records))))
    # Then every partition is fetched to its end: everything comes out.
    for p in range(3):
        watermark[p] = max(watermark[p], 100)
        check(admitted(gate.caught_up(("t", p), 100)))
    assert gate.held == 0
    assert sorted(out) == sorted(fed)  # nothing lost, nothing twice
    # Each partition in offset order.
    for p in range(3):
        assert [ts for ts, q in out if q == p] == runs[p]
    # The order rule: before a record of p, every record of a partition p waits on that
    # is older (by timestamp, then partition) came out.
    for i, (ts, p) in enumerate(out):
        for ts2, q in out[i + 1 :]:
            if q in transition.waits_on(p):
                assert (ts2, q) > (ts, p), (out, counts)
