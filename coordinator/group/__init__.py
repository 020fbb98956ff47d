"""The pure group state machine: state, records, `replay`, handlers and their effects.

Nothing here performs I/O or reads a clock: handlers are
`(state, request, now) -> Result(records, effects, error)` and `replay` is the only code
that mutates a `GroupState`, so tests drive the handoff rules with a hand-moved clock.

- `state`: a group's members, ranges, target, positions and handoffs.
- `records`: every change of a group as a value; `replay` applies them.
- `handlers`: Register, replies, Leave, lost channels, timers and `reconcile`;
  `effects`: what they ask the runtime to do.
- `load`, `demand`, `speed`: measured load per slot, records waiting per load bucket,
  each member's measured speed; `balance`: the periodic load check that reads them.

Its place among the packages: the import contracts in pyproject.toml.
"""
