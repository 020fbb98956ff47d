"""Assignment strategies: pure functions from members and measured load to slot ranges.

- `base`: the interface (`AssignmentSpec` -> `Assignment`, `Strategy`).
- `registry`: every strategy by name.
- `load-aware` (the default): a few ranges per member whose measured load matches its
  capacity share, moving close to the minimum on a join or leave; stable under small
  load drift.
- `balanced`: capacity-weighted slot counts, fewest slots moved, ranges may fragment.
- `consistent-hash`: Pulsar's ring; a pure function of the member set.
- `auto-split`: PIP-34; a joiner halves the busiest range, a leaver's range goes to its
  quieter neighbour.
- `sticky`: every member consumes exactly the ranges it declared.
- `measures`: how balanced an assignment is (the strategies, the coordinator's
  hysteresis and the benchmarks share them).

Its place among the packages: the import contracts in pyproject.toml.
"""
