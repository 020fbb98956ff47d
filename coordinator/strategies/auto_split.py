"""PIP-34's hash-range auto-split, as the proposal describes it.

Each member owns one contiguous range. A joining member takes half of the busiest
member's range; a leaving member's range goes to the adjacent member that is less busy.
Only two members are involved in any change, which is the point of the strategy: a join
or leave disturbs one neighbourhood of the key space and nobody else. The price is
balance — shares halve on every split, so after a few joins members own 1/2, 1/4, 1/8 of
the space, and nothing ever re-balances. Use `load-aware` when balance matters more than
locality of change.

This assignor is a pure function of the spec: the "events" PIP-34 reacts to are derived by
diffing `spec.current` (the previous targets) against `spec.members`, and applied one at a
time in a fixed order so the result does not depend on how the caller ordered anything:

1. gaps — slots in no current range (e.g. a departed member the caller already dropped
   from `current`, or extra ranges of a member when switching from another strategy) —
   in slot order, each as if a member owning it left;
2. members present in `current` but not in `members` leave, in id order;
3. members in `members` without a range join, in id order. With no previous ranges at
   all, the first joiner (lowest id) gets the whole space, as PIP-34's C1 does.

`capacity` is ignored: PIP-34 has no notion of it.
"""

from __future__ import annotations

from keyshard.coordinator.strategies._common import LoadPrefix, Tile, tiles_from_current
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange


class AutoSplitAssignor:
    """Halve the busiest range on a join; give a leaver's range to its quieter neighbour.

    Busiest = highest measured load summed over the member's range (`spec.slot_load`);
    without a measurement (None or all zero) the largest range. Ties go to the larger
    range, then to the lower member id. The joiner takes the upper half (floor(n/2) slots
    of an n-slot range), the busiest keeps the lower half, as in PIP-34's picture. A range
    of a single slot cannot be split; if no range has two slots the joiner gets nothing
    and a note says so.

    A leaver's range is merged into its left or right neighbour in slot order (the ends
    of the slot line do not wrap: the last range and the first are not adjacent), the one
    with the lower load; ties go to the smaller range, then to the lower id.
    """

    name = "auto-split"

    def assign(self, spec: AssignmentSpec) -> Assignment:
        wanted = {m.member_id for m in spec.members}
        # Unmeasured load reads as one unit per slot: "busiest" becomes "largest range"
        # and "lower load" becomes "smaller range", exactly the documented fallbacks.
        load = LoadPrefix(spec.slot_load)
        tiles = tiles_from_current(spec.current)
        notes: list[str] = []

        while (gap := _first_gap(tiles)) is not None:
            tiles = _merge_away(tiles, gap, load)
        for leaver in sorted(
            t.member_id for t in tiles if t.member_id and t.member_id not in wanted
        ):
            index = next(i for i, t in enumerate(tiles) if t.member_id == leaver)
            tiles = _merge_away(tiles, index, load)

        placed = {t.member_id for t in tiles}
        for joiner in sorted(wanted - placed):
            tiles, note = _split_for(tiles, joiner, load)
            if note:
                notes.append(note)

        ranges: dict[str, RangeSet] = {mid: EMPTY for mid in sorted(wanted)}
        for t in tiles:
            assert t.member_id is not None
            ranges[t.member_id] = RangeSet((t.slots,))
        return Assignment(ranges, notes=tuple(notes))


def _first_gap(tiles: list[Tile]) -> int | None:
    return next((i for i, t in enumerate(tiles) if t.member_id is None), None)


def _merge_away(tiles: list[Tile], index: int, load: LoadPrefix) -> list[Tile]:
    """Remove tile `index`, extending its quieter neighbour over its slots."""
    gone = tiles[index]
    neighbours = [i for i in (index - 1, index + 1) if 0 <= i < len(tiles)]
    if not neighbours:
        return []

    def quietness(i: int) -> tuple[float, int, str]:
        t = tiles[i]
        return (load.load(*t.slots), t.slots.size, t.member_id or "")

    heir_index = min(neighbours, key=quietness)
    heir = tiles[heir_index]
    start, end = min(heir.slots.start, gone.slots.start), max(heir.slots.end, gone.slots.end)
    merged = Tile(heir.member_id, SlotRange(start, end))
    out = list(tiles)
    out[heir_index] = merged
    del out[index]
    return out


def _split_for(tiles: list[Tile], joiner: str, load: LoadPrefix) -> tuple[list[Tile], str]:
    """Give `joiner` the upper half of the busiest splittable range."""
    if not tiles:
        return [Tile(joiner, SlotRange(0, MAX_SLOT))], ""
    splittable = [i for i, t in enumerate(tiles) if t.slots.size >= 2]
    if not splittable:
        return tiles, f"{joiner} got no slots: every range is a single slot and cannot be split"

    def busyness(i: int) -> tuple[float, int, str]:
        t = tiles[i]
        # min() over negated measures: busiest first, then larger, then the lower id.
        return (-load.load(*t.slots), -t.slots.size, t.member_id or "")

    index = min(splittable, key=busyness)
    busiest = tiles[index]
    start, end = busiest.slots
    keep = busiest.slots.size - busiest.slots.size // 2
    out = list(tiles)
    out[index] = Tile(busiest.member_id, SlotRange(start, start + keep - 1))
    out.insert(index + 1, Tile(joiner, SlotRange(start + keep, end)))
    return out, ""
