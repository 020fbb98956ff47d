"""Pure planning of the `keyshard` source: slot ranges, options, offsets, micro-batches."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.positions import Position, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.security.tls import ClientTls
from keyshard.spark_jobs.offsets import (
    GrantView,
    StreamOffset,
    grant_positions,
    next_offset,
    plan_stream,
    split_slots,
)
from keyshard.spark_jobs.planning import (
    EARLIEST,
    LATEST,
    ReadSlice,
    SourceError,
    equal_ranges,
    parse_coordinator_tls,
    parse_int,
    parse_starting_positions,
    parse_topics,
    plan_batch,
    resolve_start,
)
from tests.tls_files import make_tls_files

# ---- strategies ---------------------------------------------------------------------------

slots = st.integers(0, SLOT_COUNT - 1)


@st.composite
def range_sets(draw: st.DrawFn) -> RangeSet:
    cuts = sorted(set(draw(st.lists(slots, min_size=1, max_size=8))))
    return RangeSet(SlotRange(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False))


@st.composite
def positions(draw: st.DrawFn) -> Position:
    next_offset = draw(st.integers(0, 1000))
    points = sorted(set(draw(st.lists(st.integers(next_offset + 1, 2000), max_size=6))))
    pairs = list(zip(points[::2], points[1::2], strict=False))
    return Position.from_done([(0, next_offset), *pairs])


@st.composite
def position_maps(draw: st.DrawFn) -> RangePositionMap:
    pmap = RangePositionMap()
    for _ in range(draw(st.integers(0, 4))):
        a, b = sorted((draw(slots), draw(slots)))
        pmap.assign(SlotRange(a, b), draw(positions()))
    return pmap


tps = st.tuples(st.sampled_from(["orders", "clicks.v2", "t_1"]), st.integers(0, 3))
frontiers = st.dictionaries(tps, position_maps(), max_size=3)


# ---- slot ranges --------------------------------------------------------------------------


@given(st.integers(1, SLOT_COUNT))
def test_equal_ranges_tile_the_slot_space(count: int) -> None:
    ranges = equal_ranges(count)
    assert len(ranges) == count
    assert ranges[0].start == 0 and ranges[-1].end == SLOT_COUNT - 1
    assert all(a.end + 1 == b.start for a, b in itertools.pairwise(ranges))
    sizes = {r.size for r in ranges}
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("count", [0, -1, SLOT_COUNT + 1])
def test_equal_ranges_refuse_impossible_counts(count: int) -> None:
    with pytest.raises(SourceError, match="ranges="):
        equal_ranges(count)


@given(range_sets(), st.integers(1, 64))
def test_split_slots_covers_the_owned_slots_in_near_equal_pieces(
    owned: RangeSet, count: int
) -> None:
    pieces = split_slots(owned, count)
    union = RangeSet()
    for piece in pieces:
        assert piece and not piece.overlaps(union)
        union = union | piece
    assert union == owned
    assert len(pieces) == (min(count, owned.size) if owned else 0)
    if pieces:
        sizes = [p.size for p in pieces]
        assert max(sizes) - min(sizes) <= 1


# ---- options ------------------------------------------------------------------------------


def test_required_options_and_integers_are_checked() -> None:
    with pytest.raises(SourceError, match="option 'topics' is required"):
        parse_topics({})
    with pytest.raises(SourceError, match="empty name"):
        parse_topics({"topics": "a,,b"})
    assert parse_topics({"topics": " a, b ,a"}) == ["a", "b"]
    with pytest.raises(SourceError, match="'ranges' must be an integer"):
        parse_int({"ranges": "eight"}, "ranges", 1, 1)
    with pytest.raises(SourceError, match=r"'ranges'=0 is outside 1\.\.65536"):
        parse_int({"ranges": "0"}, "ranges", 1, 1, 65536)


def test_coordinator_tls_options_are_read_and_checked(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    assert parse_coordinator_tls({}) is None
    parsed = parse_coordinator_tls(
        {
            "coordinator_tls_ca_file": str(tls.ca),
            "coordinator_tls_cert_file": str(tls.client.cert),
            "coordinator_tls_key_file": str(tls.client.key),
        }
    )
    assert parsed == ClientTls(str(tls.ca), str(tls.client.cert), str(tls.client.key))
    with pytest.raises(SourceError, match=r"^option 'coordinator_tls_ca_file': /nope\.pem does"):
        parse_coordinator_tls({"coordinator_tls_ca_file": "/nope.pem"})
    with pytest.raises(SourceError, match="'coordinator_tls_ca_file' is required with a client"):
        parse_coordinator_tls({"coordinator_tls_cert_file": str(tls.client.cert)})


def test_starting_positions_follow_spark_kafka_format() -> None:
    parsed = parse_starting_positions('{"a": {"0": 42, "1": -2}, "b": {"3": -1}}', ["a", "b"])
    assert parsed == {("a", 0): 42, ("a", 1): EARLIEST, ("b", 3): LATEST}
    assert parse_starting_positions(None, ["a"]) == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "must be an object"),
        ('{"zzz": {"0": 1}}', "not in 'topics'"),
        ('{"a": 5}', "must map partition -> offset"),
        ('{"a": {"x": 1}}', "bad partition"),
        ('{"a": {"0": "10"}}', "offset must be an integer"),
        ('{"a": {"0": true}}', "offset must be an integer"),
        ('{"a": {"0": -3}}', "offset must be an integer"),
    ],
)
def test_bad_starting_positions_are_named(raw: str, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_starting_positions(raw, ["a"])


def test_resolve_start_checks_against_the_partition_offsets() -> None:
    marks = {("a", 0): (5, 100), ("a", 1): (0, 7)}
    assert resolve_start(marks, {}) == {("a", 0): (5, 100), ("a", 1): (0, 7)}
    assert resolve_start(marks, {("a", 0): 50, ("a", 1): LATEST}) == {
        ("a", 0): (50, 100),
        ("a", 1): (7, 7),
    }
    with pytest.raises(SourceError, match=r"outside the partition's offsets 5\.\.100"):
        resolve_start(marks, {("a", 0): 2})
    with pytest.raises(SourceError, match="do not exist"):
        resolve_start(marks, {("a", 9): 0})


def test_plan_batch_is_one_slice_per_partition_and_range_with_records() -> None:
    ranges = equal_ranges(4)
    slices = plan_batch({("a", 0): (0, 10), ("a", 1): (3, 3), ("b", 0): (2, 5)}, ranges)
    assert [(s.topic, s.partition) for s in slices] == [("a", 0)] * 4 + [("b", 0)] * 4
    assert {(s.from_offset, s.until) for s in slices} == {(0, 10), (2, 5)}


# ---- offsets ------------------------------------------------------------------------------


@given(frontiers, frontiers, st.lists(range_sets(), max_size=4))
def test_offsets_survive_a_json_round_trip(
    done: dict[tuple[str, int], RangePositionMap],
    base: dict[tuple[str, int], RangePositionMap],
    pieces: list[RangeSet],
) -> None:
    offset = StreamOffset(done, base, tuple(p for p in pieces if p))
    text = json.dumps(offset.to_json())  # what Spark stores in the checkpoint
    again = StreamOffset.from_json(json.loads(text))
    assert again == offset
    assert json.dumps(again.to_json()) == text  # canonical
    for tp, pmap in done.items():
        assert again.at(tp) == pmap


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"v": 99},
        {"v": 1, "done": {"t": {"0": [[5, 2, 0, []]]}}},
        {"v": 1, "done": {"t": {"x": [[0, 1, 0, []]]}}},
        {"v": 1, "done": {"t": {"0": [[0, 1]]}}},
        {"v": 1, "done": [1]},
        {"v": 1, "pieces": [[[9, 70000]]]},
    ],
)
def test_malformed_offsets_are_source_errors(bad: object) -> None:
    with pytest.raises(SourceError):
        StreamOffset.from_json(bad)


# ---- micro-batches: every record exactly once ------------------------------------------------


def records_of(piece: ReadSlice, log: dict[tuple[str, int], list[int]]) -> list[tuple[int, int]]:
    """What an executor keeps of `piece`, given each partition's slot per offset."""
    wants = piece.slot_filter().wants
    slot_at = log[piece.tp]
    until = min(piece.until, len(slot_at))
    return [(o, slot_at[o]) for o in range(piece.from_offset, until) if wants(slot_at[o], o)]


@given(
    st.integers(0, 2**32),
    st.lists(st.integers(0, 40), min_size=3, max_size=8),
    st.integers(1, 6),
)
def test_batches_read_every_owned_record_exactly_once(
    seed: int, growth: list[int], pieces: int
) -> None:
    """A query owning every slot, with records arriving between batches, reads each record
    of each partition once, in offset order within a task, and skips offsets the previous
    owner had acknowledged ahead."""
    rng = random.Random(seed)
    partitions = [("t", 0), ("t", 1)]
    log: dict[tuple[str, int], list[int]] = {tp: [] for tp in partitions}
    # Handed over: slots below 30000 of ("t", 0) done up to 3, plus 5..8 acknowledged ahead.
    handed = {("t", 0): [(SlotRange(0, 29999), Position.from_done([(0, 3), (5, 8)]))]}
    grants = [GrantView(RangeSet.full(), grant_positions(handed))]
    offset = StreamOffset()
    seen: list[tuple[TopicPartition, int]] = []
    for step, count in enumerate(growth):
        for tp in partitions:
            log[tp].extend(rng.randrange(SLOT_COUNT) for _ in range(count + (step == 0) * 10))
        marks = {tp: len(records) for tp, records in log.items()}
        end = next_offset(offset, grants, marks, pieces)
        for piece in plan_stream(offset, end):
            got = records_of(piece, log)
            assert [o for o, _ in got] == sorted(o for o, _ in got)
            seen.extend((piece.tp, o) for o, _ in got)
        offset = StreamOffset.from_json(json.loads(json.dumps(end.to_json())))
    skipped = {
        (("t", 0), o)
        for o in (0, 1, 2, 5, 6, 7)
        if o < len(log[("t", 0)]) and log[("t", 0)][o] < 30000
    }
    want = {(tp, o) for tp in partitions for o in range(len(log[tp]))} - skipped
    assert len(seen) == len(set(seen))
    assert set(seen) == want


def test_a_restarted_query_starts_from_the_union_of_checkpoint_and_coordinator() -> None:
    """Checkpoint ahead on slots 0..99, coordinator ahead on 100..199 (another member ran
    them meanwhile): the next batch reads from whichever is further, per slot."""
    tp = ("t", 0)
    mine = RangePositionMap()
    mine.assign(SlotRange(0, 99), Position(50))
    mine.assign(SlotRange(100, 199), Position(10))
    checkpoint = StreamOffset({tp: mine})
    given_ = {tp: [(SlotRange(0, 99), Position(20)), (SlotRange(100, 199), Position(40))]}
    grants = [GrantView(RangeSet.from_pairs([(0, 199)]), grant_positions(given_))]
    end = next_offset(checkpoint, grants, {tp: 60}, 1)
    (piece,) = plan_stream(checkpoint, end)
    low = {seg.start: lower.next_offset for seg, lower, _ in piece.segments}
    assert low == {0: 50, 100: 40}
    assert all(upper.next_offset == 60 for _, _, upper in piece.segments)


def test_unowned_slots_keep_their_checkpointed_position_and_are_not_read() -> None:
    tp = ("t", 0)
    mine = RangePositionMap()
    mine.assign(SlotRange(0, SLOT_COUNT - 1), Position(30))
    start = StreamOffset({tp: mine})
    half = RangeSet.from_pairs([(0, 32767)])
    end = next_offset(start, [GrantView(half, {})], {tp: 80}, 2)
    assert end.at(tp).get(40000) == Position(30)
    assert end.at(tp).get(100) == Position(80)
    assert all(piece.size == 16384 for piece in end.pieces)
    slices = plan_stream(start, end)
    assert len(slices) == 2
    assert all(seg.end <= 32767 for s in slices for seg, _, _ in s.segments)


def test_nothing_new_gives_the_same_offset() -> None:
    tp = ("t", 0)
    grants = [GrantView(RangeSet.full(), {})]
    first = next_offset(StreamOffset(), grants, {tp: 10}, 2)
    assert next_offset(first, grants, {tp: 10}, 2) == first
    assert plan_stream(first, first) == []
