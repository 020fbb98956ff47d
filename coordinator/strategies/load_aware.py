"""Load-aware ranges: the default strategy.

Each member's share of the measured load (`spec.slot_load`) matches its share of
capacity at its measured speed (`_common.weight`), and a rebalance moves about as little
load as that requires. Slot counts are the wrong thing to balance: with skewed keys one
slot can carry more records than ten thousand others, so equal slot counts can still
leave one consumer with most of the work.

It is `balanced` weighted by load (all pure, all deterministic):

1. The profile to balance caps every slot at the smallest member's fair share
   (`measures.capped`): a hotter slot cannot be split, and counting it as one full share gives
   its holder little else while the others balance among themselves. Member j's fair
   load is the capped total times its share of the weights.
2. Hysteresis. With nothing orphaned, the current assignment is kept while every member is
   within `tolerance` of its fair load, or while it is within `tolerance` of the
   assignment step 3 would place (slots hotter than the tolerance make a tighter band
   unreachable). Identical load moves nothing, drifting load moves little.
3. Otherwise members keep what they own. A member above its fair load by more than half
   the tolerance releases the excess: whole small ranges first (which also undoes old
   fragmentation), then slices from a range edge, preferring an edge next to free slots
   or an under-loaded member. When the released load would not cover what the
   under-loaded members lack, the release limit is lowered towards the fair load (a
   join: every member gives up about its share of the joiner's load, not more).
   Members below their fair load by more than half the tolerance then fill up to it,
   most under-loaded first, from free slots adjacent to their own ranges, then from the
   free run that best fits the deficit; leftovers go to members still below their fair
   load, and finally to the less loaded owner next to them.
4. Fragmentation is bounded: a member with more than `max_ranges` ranges hands its
   lightest ranges back to the pool (and refills), so churn cannot pile up fragments.

Without a measurement (slot_load None or all zero) every slot weighs 1, which balances
slot counts like `quotas` (within the tolerance). A slot hotter than the fair share of
the smallest member is named in `Assignment.notes` with its share of the load; it is part
of the optimum the bands are measured against, so it does not cause repeated
rebalancing.

The measures of balance (`imbalance`, `balancing_imbalance`, `achievable_imbalance`) are
in `coordinator.strategies.measures`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping

from keyshard.coordinator.strategies._common import LoadPrefix, weight
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, MemberSpec
from keyshard.coordinator.strategies.measures import achievable_imbalance, capped
from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

_MAX_PASSES = 4
_SLICE_CANDIDATES = 16


class LoadAwareAssignor:
    """Ranges whose measured loads match weight shares, moving few slots.

    `tolerance` is in units of a fair share: the current assignment is kept while no
    member is above its fair share by more than it, nor below by more than twice it
    (under-load does not raise the busiest member's share, which is what balance is
    about; a symmetric band would make small load drifts trigger large moves). A
    rebalance aims for half of it. `max_ranges` bounds how many ranges a member may own
    (a member above it releases its lightest ranges and refills). `max_notes` caps how
    many hot slots are named in `Assignment.notes`.
    """

    name = "load-aware"

    def __init__(self, tolerance: float = 0.05, max_notes: int = 5, max_ranges: int = 16) -> None:
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        if max_ranges < 1:
            raise ValueError("max_ranges must be >= 1")
        self.tolerance = tolerance
        self.max_notes = max_notes
        self.max_ranges = max_ranges

    def assign(self, spec: AssignmentSpec) -> Assignment:
        members = {m.member_id: m for m in spec.members}
        if not members:
            return Assignment({})
        if len(members) > SLOT_COUNT:
            raise ValueError(f"{len(members)} members cannot each own one of {SLOT_COUNT} slots")
        measured = LoadPrefix(spec.slot_load)
        caps = {mid: weight(m) for mid, m in members.items()}
        total_cap = sum(caps.values())
        load = capped(measured, min(caps.values()) / total_cap)
        fair = {mid: load.total * c / total_cap for mid, c in caps.items()}
        current = _claimed(spec.current, members)
        notes = self._hot_slot_notes(measured, members) if measured.measured else ()
        complete = sum(sum(b - a + 1 for a, b in rs) for rs in current.values()) == SLOT_COUNT
        keep_low, keep_high = 1 - 2 * self.tolerance, 1 + self.tolerance
        if complete and self._fits(load, fair, current, keep_low, keep_high):
            return Assignment(_to_ranges(current), notes=notes)
        # A rebalance can leave a member outside the band (a slot too heavy to place
        # well); the next one would then move again with nothing changed. So repeat until
        # the result is one the next call keeps (in practice at most one extra pass).
        result = current
        for _ in range(_MAX_PASSES):
            target = _Rebalance(load, fair, result, self.tolerance / 2, self.max_ranges).run()
            if complete or result is not current:
                lo, hi = _ratio_span(load, fair, target)
                if self._fits(load, fair, result, lo - self.tolerance, hi + self.tolerance):
                    break
            result = target
        return Assignment(_to_ranges(result), notes=notes)

    def _fits(
        self,
        load: LoadPrefix,
        fair: Mapping[str, float],
        owned: Mapping[str, list[SlotRange]],
        low: float,
        high: float,
    ) -> bool:
        """Every member's load within [low, high] fair shares."""
        for mid, runs in owned.items():
            ratio = sum(load.load(a, b) for a, b in runs) / fair[mid] if fair[mid] else 1.0
            if not low - 1e-9 <= ratio <= high + 1e-9:
                return False
        return True

    def _hot_slot_notes(
        self, load: LoadPrefix, members: Mapping[str, MemberSpec]
    ) -> tuple[str, ...]:
        caps = [weight(m) for m in members.values()]
        fair_share = min(caps) / sum(caps)
        threshold = load.total * fair_share
        hot = sorted(
            (s for s, w in enumerate(load.weights) if w > threshold),
            key=lambda s: (-load.weights[s], s),
        )
        bound = achievable_imbalance(load.weights, tuple(members.values()))
        notes = [
            f"slot {s} carries {load.weights[s] / load.total:.1%} of the measured load, more "
            f"than the smallest member's fair share ({fair_share:.1%}); a slot cannot be "
            f"split, so imbalance stays >= {bound:.2f}"
            for s in hot[: self.max_notes]
        ]
        if len(hot) > self.max_notes:
            notes.append(f"... and {len(hot) - self.max_notes} more slots above a fair share")
        return tuple(notes)


def _claimed(
    current: Mapping[str, RangeSet], members: Mapping[str, MemberSpec]
) -> dict[str, list[SlotRange]]:
    """What each present member owns now (an overlap goes to the lower id)."""
    claimed = EMPTY
    owned: dict[str, list[SlotRange]] = {}
    for mid in sorted(members):
        mine = current.get(mid, EMPTY) - claimed
        owned[mid] = list(mine.ranges)
        claimed = claimed | mine
    return owned


def _merged(runs: list[SlotRange]) -> list[SlotRange]:
    out: list[SlotRange] = []
    for a, b in sorted(runs):
        if out and a <= out[-1][1] + 1:
            out[-1] = SlotRange(out[-1].start, max(out[-1].end, b))
        else:
            out.append(SlotRange(a, b))
    return out


def _insert_merged(runs: list[SlotRange], run: SlotRange) -> None:
    """Add `run` to sorted, disjoint, maximal `runs` (which it does not overlap), merging
    it with the runs it touches: `_merged(runs + [run])` without sorting them all."""
    i = bisect_left(runs, run)
    a, b = run
    if i < len(runs) and runs[i][0] == b + 1:
        b = runs.pop(i)[1]
    if i > 0 and runs[i - 1][1] + 1 == a:
        i -= 1
        a = runs.pop(i)[0]
    runs.insert(i, SlotRange(a, b))


def _to_ranges(owned: Mapping[str, list[SlotRange]]) -> dict[str, RangeSet]:
    return {mid: RangeSet(_merged(owned[mid])) for mid in sorted(owned)}


def _ratio_span(
    load: LoadPrefix, fair: Mapping[str, float], owned: Mapping[str, list[SlotRange]]
) -> tuple[float, float]:
    ratios = [
        sum(load.load(a, b) for a, b in runs) / fair[mid] if fair[mid] else 1.0
        for mid, runs in owned.items()
    ]
    return min(ratios), max(ratios)


class _Rebalance:
    """One rebalance: keep, release the excess, fill the deficits (see the module doc)."""

    def __init__(
        self,
        load: LoadPrefix,
        fair: Mapping[str, float],
        current: Mapping[str, list[SlotRange]],
        band: float,
        max_ranges: int,
    ) -> None:
        self.load = load
        self.fair = fair
        self.band = band
        self.max_ranges = max_ranges
        self.owned = {mid: _merged(runs) for mid, runs in current.items()}
        self.held = {mid: self._sum(runs) for mid, runs in self.owned.items()}
        taken = sorted(r for runs in self.owned.values() for r in runs)
        self.free: list[SlotRange] = []  # sorted, disjoint, maximal
        cursor = 0
        for a, b in taken:
            if a > cursor:
                self.free.append(SlotRange(cursor, a - 1))
            cursor = b + 1
        if cursor <= MAX_SLOT:
            self.free.append(SlotRange(cursor, MAX_SLOT))
        # The free runs again, by (load, start): `_best_piece` looks at the heaviest run
        # not above a deficit and at the runs above it, not at every free run.
        self.by_weight: list[tuple[float, int, int]] = sorted(
            (self.load.load(a, b), a, b) for a, b in self.free
        )
        self._freed: list[SlotRange] = []  # pieces given back, for `_donate`
        # Owner of each owned run, by start (for "who is next to this edge"); built once,
        # then kept by `_reindex`.
        self.owner_at: dict[int, tuple[int, str]] = {
            a: (b, mid) for mid, runs in self.owned.items() for a, b in runs
        }
        self.starts = sorted(self.owner_at)

    def _reindex(self, run: SlotRange, owner: str) -> None:
        """The indexed runs inside `run` are `owner`'s now. The index stays keyed by the
        runs as they were (whole runs move here, so their starts are all indexed):
        rebuilding it for each range moved would be quadratic in the ranges of a
        fragmented group, seconds for thousands."""
        first, last = bisect_left(self.starts, run[0]), bisect_right(self.starts, run[1])
        for start in self.starts[first:last]:
            self.owner_at[start] = (self.owner_at[start][0], owner)

    def _owner_beside(self, run: SlotRange, mid: str) -> str | None:
        """The less loaded other owner of a slot next to `run` (None if both are free)."""
        beside = {
            m for m in (self._neighbour(run[0] - 1), self._neighbour(run[1] + 1)) if m is not None
        } - {mid}
        return min(beside, key=lambda m: (self.ratio(m), m)) if beside else None

    def _sum(self, runs: list[SlotRange]) -> float:
        return sum(self.load.load(a, b) for a, b in runs)

    def ratio(self, mid: str) -> float:
        return self.held[mid] / self.fair[mid] if self.fair[mid] else 1.0

    # -- the free pool ----------------------------------------------------------------

    def _free_pop(self, i: int) -> SlotRange:
        run = self.free.pop(i)
        a, b = run
        self.by_weight.pop(bisect_left(self.by_weight, (self.load.load(a, b), a, b)))
        return run

    def _free_insert(self, i: int, a: int, b: int) -> None:
        self.free.insert(i, SlotRange(a, b))
        insort(self.by_weight, (self.load.load(a, b), a, b))

    def _add_free(self, a: int, b: int) -> None:
        self._freed.append(SlotRange(a, b))
        i = bisect_left(self.free, (a, b))
        if i > 0 and self.free[i - 1][1] + 1 == a:
            i -= 1
            a = self._free_pop(i)[0]
        if i < len(self.free) and self.free[i][0] == b + 1:
            b = self._free_pop(i)[1]
        self._free_insert(i, a, b)

    def _take_free(self, a: int, b: int) -> None:
        """Remove [a, b] from the free run containing it."""
        i = bisect_right(self.free, (a, MAX_SLOT + 1)) - 1
        ra, rb = self._free_pop(i)
        assert ra <= a and b <= rb
        if b < rb:
            self._free_insert(i, b + 1, rb)
        if ra < a:
            self._free_insert(i, ra, a - 1)

    def _neighbour(self, slot: int) -> str | None:
        """Owner of `slot` as of the start (None if free or out of range)."""
        if not 0 <= slot <= MAX_SLOT:
            return None
        i = bisect_right(self.starts, slot) - 1
        if i < 0:
            return None
        end, mid = self.owner_at[self.starts[i]]
        # Valid until the fills start: a slot not free is still the indexed owner's.
        return mid if slot <= end and not self._is_free(slot) else None

    def _is_free(self, slot: int) -> bool:
        if not 0 <= slot <= MAX_SLOT:
            return False
        i = bisect_right(self.free, (slot, MAX_SLOT + 1)) - 1
        return i >= 0 and self.free[i][0] <= slot <= self.free[i][1]

    # -- release ----------------------------------------------------------------------

    def _release(self, mid: str, limit: float, needy: set[str]) -> None:
        """Give up load above `limit`: lightest whole ranges first, then an edge slice."""
        excess = self.held[mid] - limit
        if excess <= 0:
            return
        runs = self.owned[mid]
        by_weight = sorted(runs, key=lambda r: (self.load.load(*r), r[1] - r[0], -r[0]))
        for r in by_weight:
            w = self.load.load(*r)
            if len(runs) <= 1 or w > excess:
                break
            runs.remove(r)
            self._add_free(*r)
            self.held[mid] -= w
            excess -= w
        if excess <= 0:
            return
        # Slice an edge: one whose cut comes close to the excess (a hot slot near an edge
        # can make one side useless), preferring an edge next to free slots or to a
        # member that needs load (its fill then stays adjacent).
        near_enough = self.band * self.fair[mid] / 2
        best: tuple[tuple[bool, int, float, SlotRange, bool], SlotRange] | None = None
        for run in runs:
            a, b = run
            for high in (True, False):
                cut = self._cut(a, b, excess, from_high=high, at_least=True)
                if cut is None:
                    continue
                error = abs(self.load.load(*cut) - excess)
                edge = b + 1 if high else a - 1
                score = 2 if self._is_free(edge) else 1 if self._neighbour(edge) in needy else 0
                key = (error <= near_enough, score, -error, run, high)
                if best is None or key > best[0]:
                    best = (key, cut)
        if best is None:
            return
        cut_from, high = best[0][3], best[0][4]
        a, b = cut_from
        ca, cb = best[1]
        runs.remove(cut_from)
        if high:
            if a < ca:
                runs.append(SlotRange(a, ca - 1))
        elif cb < b:
            runs.append(SlotRange(cb + 1, b))
        runs.sort()
        self._add_free(ca, cb)
        self.held[mid] -= self.load.load(ca, cb)

    def _cut(
        self, a: int, b: int, want: float, from_high: bool, at_least: bool = False
    ) -> SlotRange | None:
        """A slice of [a, b] at one end whose load is closest to `want` (never all of it
        when releasing; None if the closest is empty)."""
        load = self.load
        if from_high:
            # largest s with load(s, b) >= want, and s + 1
            s_over = bisect_right(load.prefix, load.prefix[b + 1] - want) - 1
            s_over = max(a, min(b, s_over))
            options = [s_over, s_over + 1]
            s = min(
                options,
                key=lambda s: (abs(load.load(s, b) - want) if s <= b else want, -s),
            )
            if at_least and s == a:
                s = a + 1
            return SlotRange(s, b) if s <= b else None
        e_over = max(a, min(b, load.first_end_reaching(load.prefix[a] + want)))
        e = min(
            [e_over - 1, e_over],
            key=lambda e: (abs(load.load(a, e) - want) if e >= a else want, e),
        )
        if at_least and e == b:
            e = b - 1
        return SlotRange(a, e) if e >= a else None

    # -- fill -------------------------------------------------------------------------

    def _fill(self, mid: str, want: float, must_take: bool) -> None:
        """Take about `want` load from the pool: adjacent runs first, then best fit."""
        runs = self.owned[mid]
        while self.free and (want > 0 or (must_take and not runs)):
            piece = self._adjacent_piece(runs, want) or self._best_piece(want, not runs)
            if piece is None:
                return
            self._take_free(*piece)
            runs.append(piece)
            runs[:] = _merged(runs)
            got = self.load.load(*piece)
            self.held[mid] += got
            want -= got

    def _adjacent_piece(self, runs: list[SlotRange], want: float) -> SlotRange | None:
        """The heaviest free run touching one of `runs`, or the slice of it nearest them."""
        best: SlotRange | None = None
        best_w = -1.0
        for a, b in runs:
            for high, edge in ((False, b + 1), (True, a - 1)):  # take the near end
                if not self._is_free(edge):
                    continue
                run = self.free[bisect_right(self.free, (edge, MAX_SLOT + 1)) - 1]
                w = self.load.load(*run)
                piece = run if w <= want else self._cut(*run, want, from_high=high)
                if piece is not None and w > best_w:
                    best, best_w = piece, w
        return best

    def _best_piece(self, want: float, must: bool) -> SlotRange | None:
        """A whole free run or an end slice of one whose load is closest to `want`."""
        best: tuple[float, float, int] | None = None
        pick: SlotRange | None = None
        # Two kinds of run compete: a whole run not above `want` (the heaviest such,
        # lowest first, is closest) and a slice of a heavier run. Slices of the
        # `_SLICE_CANDIDATES` heaviest runs are compared (ties go to the heavier run
        # anyway); looking at every run would make each fill O(free runs), quadratic in
        # members.
        by_weight = self.by_weight
        heavier = bisect_right(by_weight, (want, MAX_SLOT + 1, MAX_SLOT + 1))
        first = max(heavier, len(by_weight) - _SLICE_CANDIDATES)
        candidates = [SlotRange(a, b) for _, a, b in by_weight[first:]]
        if heavier:
            lightest_best = bisect_left(by_weight, (by_weight[heavier - 1][0], -1, -1))
            candidates.append(SlotRange(*by_weight[lightest_best][1:]))
        for a, b in candidates:
            w = self.load.load(a, b)
            options: list[SlotRange | None] = (
                [SlotRange(a, b)]
                if w <= want
                else [self._cut(a, b, want, from_high=False), self._cut(a, b, want, True)]
            )
            for piece in options:
                if piece is None:
                    continue
                key = (abs(self.load.load(*piece) - want), -w, piece[0])
                if best is None or key < best:
                    best, pick = key, piece
        if pick is None and must:  # owns nothing yet: at least one slot
            a, b = min(self.free, key=lambda r: (self.load.load(r[0], r[0]), r[0]))
            pick = SlotRange(a, a)
        if pick is not None and self.load.load(*pick) == 0 and want > 0 and not must:
            return pick if self.load.load(*pick) < want else None
        return pick

    # -- the whole rebalance ----------------------------------------------------------

    def run(self) -> dict[str, list[SlotRange]]:
        fair = self.fair
        ids = sorted(self.owned)
        # Too many ranges: the lightest go to the owner next to them (which merges them
        # into its own range, so its count does not grow); the loads are evened out by
        # the release and fill below.
        for mid in ids:
            runs = self.owned[mid]
            if len(runs) <= self.max_ranges:
                continue
            by_weight = sorted(runs, key=lambda r: (self.load.load(*r), r[0]))
            for r in by_weight[: len(runs) - self.max_ranges]:
                heir = self._owner_beside(r, mid)
                runs.remove(r)
                self.held[mid] -= self.load.load(*r)
                if heir is None:
                    self._add_free(*r)  # `_neighbour` sees free slots as nobody's
                else:
                    _insert_merged(self.owned[heir], r)
                    self.held[heir] += self.load.load(*r)
                    self._reindex(r, heir)
        lo, hi = 1 - self.band, 1 + self.band
        needy = {mid for mid in ids if self.held[mid] < lo * fair[mid] or not self.owned[mid]}
        need = sum(fair[mid] - self.held[mid] for mid in needy)
        # Above the band: release down to its top.
        for mid in sorted(ids, key=lambda m: (-self.ratio(m), m)):
            if mid not in needy and self.held[mid] > hi * fair[mid]:
                self._release(mid, hi * fair[mid], needy)
        # Not enough for those below it (a join): more donors, each down to the band's
        # bottom so that few are needed, next to free slots first (their slice then
        # joins an existing free run instead of making a new one), fullest first.
        short = need - sum(self.load.load(a, b) for a, b in self.free)
        if short > 0:
            donors = [m for m in ids if m not in needy and self.held[m] > lo * fair[m]]
            self._donate(donors, short, lo, needy)
        order = sorted(ids, key=lambda m: (self.ratio(m), m))
        for mid in order:
            if mid in needy:
                self._fill(mid, fair[mid] - self.held[mid], must_take=True)
        for mid in sorted(ids, key=lambda m: (self.ratio(m), m)):
            if self.held[mid] < fair[mid]:
                self._fill(mid, fair[mid] - self.held[mid], must_take=False)
        self._leftovers()
        return self.owned

    def _donate(self, donors: list[str], short: float, lo: float, needy: set[str]) -> None:
        """Donors release down to the band's bottom until `short` is covered: those next
        to free slots first, fullest first (max of (touches free, ratio, id)).

        Only the chosen donor's load changes and free slots only grow here, so a donor's
        rank changes only when a release frees a slot beside it: the order is computed
        once and the "touches free" flag re-checked for the owners beside each freed
        piece, instead of re-ranking every donor per donation (quadratic in members).
        """
        order = sorted(donors, key=lambda m: (self.ratio(m), m), reverse=True)
        rank = {m: i for i, m in enumerate(order)}
        touching = [
            rank[m]
            for m in order
            if any(self._is_free(a - 1) or self._is_free(b + 1) for a, b in self.owned[m])
        ]
        heapq.heapify(touching)
        taken: set[str] = set()
        cursor = 0
        while short > 0 and len(taken) < len(order):
            while touching and order[touching[0]] in taken:
                heapq.heappop(touching)
            if touching:
                donor = order[heapq.heappop(touching)]
            else:
                while order[cursor] in taken:
                    cursor += 1
                donor = order[cursor]
            taken.add(donor)
            before = self.held[donor]
            give = min(before - lo * self.fair[donor], short)
            self._freed = []
            self._release(donor, before - give, needy)
            short -= before - self.held[donor]
            for a, b in self._freed:
                for slot in (a - 1, b + 1):
                    beside = self._neighbour(slot)
                    if beside in rank and beside not in taken:
                        heapq.heappush(touching, rank[beside])

    def _leftovers(self) -> None:
        """Free runs left over (rounding, heavy slots): the least loaded member below its
        fair load takes the nearest piece; what nobody lacks goes to the less loaded
        owner next to it.

        Only the member that took a piece changes its load, so the least loaded one comes
        from a heap; once it lacks nothing, nobody does, and the rest of the pool goes to
        neighbours, whose owners do not change while it is handed out."""
        queue = [(self.ratio(m), m) for m in self.owned]
        heapq.heapify(queue)
        while self.free:
            _, mid = queue[0]
            want = self.fair[mid] - self.held[mid]
            if want <= 0:
                break
            runs = self.owned[mid]
            piece = self._adjacent_piece(runs, want) or self._best_piece(want, True)
            assert piece is not None
            self._take_free(*piece)
            runs[:] = _merged([*runs, piece])
            self.held[mid] += self.load.load(*piece)
            heapq.heapreplace(queue, (self.ratio(mid), mid))
        if not self.free:
            return
        pieces = sorted((r, m) for m, runs in self.owned.items() for r in runs)
        starts = [r[0] for r, _ in pieces]
        while self.free:
            a, b = self._free_pop(len(self.free) - 1)
            i = bisect_left(starts, a)
            beside = []
            if i > 0 and pieces[i - 1][0][1] == a - 1:
                beside.append(pieces[i - 1][1])
            if i < len(pieces) and pieces[i][0][0] == b + 1:
                beside.append(pieces[i][1])
            heir = min(beside or list(self.owned), key=lambda m: (self.ratio(m), m))
            self.owned[heir] = _merged([*self.owned[heir], SlotRange(a, b)])
            self.held[heir] += self.load.load(a, b)
