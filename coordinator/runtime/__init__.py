"""The coordinator's I/O shell around the pure group core.

Every event (a Register, a reply, a closed channel, a timer) becomes one handler call whose
result is replayed, reconciled and carried out here. `operations` is the admin side's
public way in: reads of a group's state and operator actions, through the same path.

- `runtime`: `CoordinatorRuntime`, the apply path and the groups this replica serves;
  `config`: what it is configured with.
- `sender`, `pings`, `verdicts`: requests to members in order, liveness pings, and
  timer verdicts that first read what a member already sent.
- `durability`, `takeover`: group commit to the state log, and a group as a replica
  taking it over finds it there.
- `recompute`, `timers`, `partition_counts`, `location`, `activity`: recomputes off the
  loop, keyed timers, coalesced metadata for Register, where a group is served, and
  what the coordinator spends its time on.

Its place among the packages: the import contracts in pyproject.toml.
"""
