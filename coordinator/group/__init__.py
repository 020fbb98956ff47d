"""The pure group state machine: state, records, `replay`, handlers and their effects.

Layer: above `coordinator.strategies` (and `model`, `protocol` for error codes); below the
runtime. Nothing here performs I/O or reads a clock: handlers are
`(state, request, now) -> Result(records, effects, error)` and `replay` is the only code
that mutates a `GroupState`, so tests drive the handoff rules with a hand-moved clock.
"""
