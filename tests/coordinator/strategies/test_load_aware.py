"""The load-aware rebalance's range bookkeeping (its placements: test_strategies.py)."""

from __future__ import annotations

import itertools

from hypothesis import assume, given
from hypothesis import strategies as st

from keyshard.coordinator.strategies.load_aware import _insert_merged, _merged
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.ranges import SlotRange

cuts = st.lists(st.integers(1, MAX_SLOT), min_size=1, max_size=40, unique=True)


@given(cuts, st.data())
def test_inserting_a_run_merges_it_as_merging_them_all_does(
    points: list[int], data: st.DataObject
) -> None:
    """A fragmented group hands thousands of ranges to their neighbours one at a time;
    each is inserted into the heir's runs in place, which must equal merging them all."""
    pieces = [
        SlotRange(a, b - 1) for a, b in itertools.pairwise([0, *sorted(points), MAX_SLOT + 1])
    ]
    kept = data.draw(st.lists(st.booleans(), min_size=len(pieces), max_size=len(pieces)))
    mine = list(itertools.compress(pieces, kept))
    others = [piece for piece, keep in zip(pieces, kept, strict=True) if not keep]
    assume(others)
    run = data.draw(st.sampled_from(others))
    runs = _merged(mine)
    _insert_merged(runs, run)
    assert runs == _merged([*mine, run])
