"""Where a group is served, as every door of a replica answers it: the consumer
channel's Metadata and the admin API's forwarding.

The replication layer knows the answer (`coordinator.replication`); the layers that only
need to ask it (`coordinator.server`, `api`) see this protocol, and a coordinator without
replicas (tests, tools) answers with `Standalone`: every group is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from keyshard.coordinator.runtime.runtime import CoordinatorRuntime


@dataclass(frozen=True, slots=True)
class Location:
    replica_id: str | None  # None: nobody serves the group's partition yet
    address: str | None  # its consumer channel, as consumers reach it
    admin_url: str | None
    epoch: int  # the coordinator epoch of the group's state partition
    active: bool  # the owner is known and serving it
    local: bool  # this replica is the owner
    # The addresses come from a record signed with the replica secret (or are this
    # replica's own): only then may a request, and a caller's credentials, go there.
    verified: bool = False


class Replicas(Protocol):
    def locate(self, group: str) -> Location:
        """Who serves `group` now, as this replica knows it."""
        ...

    def peers(self) -> dict[str, str]:
        """Every other live replica whose admin URL is verified (a beat signed with the
        replica secret): replica id -> admin URL."""
        ...

    def unverified_peers(self) -> list[str]:
        """Every other live replica whose admin URL cannot be verified (no replica
        secret): nothing is sent there."""
        ...


class Standalone:
    """One coordinator and no replicas: every group is served here, when it is ready."""

    def __init__(self, runtime: CoordinatorRuntime) -> None:
        self.runtime = runtime

    def locate(self, group: str) -> Location:
        config = self.runtime.config
        return Location(
            config.coordinator_id, config.advertised_address, None,
            self.runtime.epoch_of(group), self.runtime.ready, True, True,
        )  # fmt: skip

    def peers(self) -> dict[str, str]:
        return {}

    def unverified_peers(self) -> list[str]:
        return []
