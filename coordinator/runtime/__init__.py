"""The coordinator's I/O shell around the pure group core.

Layer: above `coordinator.group` and `coordinator.storage`; below `coordinator.server`.
Every event (a Register, a reply, a closed channel, a timer) becomes one handler call whose
result is replayed, reconciled and carried out here. `operations` is the admin side's
public way in: reads of a group's state and operator actions, through the same path.
"""
