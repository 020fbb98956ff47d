"""The runtime's configuration, with the defaults the daemon's flags start from."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from keyshard.coordinator.group.bounds import Bounds
from keyshard.coordinator.group.growth import DEFAULT_GROWTH_WINDOW_MS
from keyshard.coordinator.group.state import GroupConfig, OffsetReset
from keyshard.coordinator.storage.base import DEFAULT_STATE_TOPIC


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    bootstrap_servers: str
    advertised_address: str = "127.0.0.1:0"
    state_topic: str = DEFAULT_STATE_TOPIC
    group_defaults: GroupConfig = field(default_factory=GroupConfig)
    # What a member may declare, report, and how many of them (coordinator.group.bounds).
    bounds: Bounds = field(default_factory=Bounds)
    flush_interval_ms: int = 200
    # A stale target is recomputed once membership was quiet this long (a storm of
    # joins shares one recompute), but at most this long after it went stale.
    recompute_quiet_ms: int = 100
    recompute_max_defer_ms: int = 2_000
    # ... and once quiet this long, even for its first member, in a forming group (no
    # slot ran since it formed): waiting costs nothing there, and a storm's tail may come
    # a TCP retransmit later (at most recompute.FORMING_MAX_DEFER_S after it went stale).
    recompute_idle_quiet_ms: int = 1_500
    # How often the partitions of every group's topics (and what its pattern matches) are
    # read from the cluster (coordinator.runtime.partition_watch); 0: never.
    metadata_refresh_ms: int = 5_000
    # How long after a topic grew a producer may still write by the old partition count
    # (Kafka's metadata.max.age.ms): records up to then are admitted in timestamp order.
    partition_growth_window_ms: int = DEFAULT_GROWTH_WINDOW_MS
    coordinator_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # Per-group overrides of group_defaults: group -> assignor name, and group -> where
    # it starts when new.
    group_assignors: Mapping[str, str] = field(default_factory=dict)
    group_offset_resets: Mapping[str, OffsetReset] = field(default_factory=dict)

    def config_for(self, group: str) -> GroupConfig:
        config = self.group_defaults
        assignor = self.group_assignors.get(group)
        if assignor is not None:
            config = replace(config, assignor=assignor)
        reset = self.group_offset_resets.get(group)
        if reset is not None:
            config = replace(config, auto_offset_reset=reset)
        return config
