"""What a Register must pass before it may touch a group: the server's bounds, the topics
it names, and its principal's permission to read them (Kafka's model,
`coordinator.runtime.authorization`).

A Register is how a group comes to exist on a replica, so whatever it is refused for is
decided here, before the group is created: a refused Register leaves nothing behind (no
group squatted by a principal that may not read it), and whether a named topic exists is
told only to a principal that may read it.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.authorization import Authorizer, register_verdict
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.coordinator.runtime.partition_counts import CoalescedPartitionCounts
from keyshard.coordinator.runtime.subscription import Subscriptions
from keyshard.coordinator.storage.base import ClusterMetadata
from keyshard.core.protocol.messages import ErrorCode, RegisterRequest
from keyshard.core.security.identity import Principal


class RegisterGate:
    def __init__(
        self,
        config: RuntimeConfig,
        metadata: ClusterMetadata,
        groups: Mapping[str, GroupState],
        authorizer: Authorizer,
    ) -> None:
        self.config = config
        self.authorizer = authorizer  # who may join which group
        self._groups = groups  # the groups served here (only read)
        self._subscriptions = Subscriptions(
            CoalescedPartitionCounts(metadata),
            CoalescedPartitionCounts(metadata, every_topic=True),
        )

    async def admit(
        self, request: RegisterRequest, principal: Principal, host: str
    ) -> dict[str, int]:
        """The partition count of each topic the Register reads, once `principal` (from
        `host`) may join its group with it; CoordinatorError with the refusal otherwise.
        In order: the bounds (nothing asked of Kafka for a Register refused anyway), the
        permission, then whether the named topics exist."""
        bounds = self.config.bounds
        refused = bounds.session_refusal(request.session_timeout_ms)
        if refused is None and request.group not in self._groups:
            refused = bounds.groups_refusal(request.group, len(self._groups))
        if refused is not None:
            raise CoordinatorError(*refused)
        pattern = request.topic_pattern
        counts, missing = await self._subscriptions.counts(tuple(request.topics), pattern)
        # Named topics are authorized as named; a pattern's, as it matches them now.
        read = tuple(request.topics) if pattern is None else tuple(sorted(counts))
        verdict = await register_verdict(self.authorizer, principal, host, request.group, read)
        if verdict is not None:
            raise CoordinatorError(*verdict)
        if missing:
            raise CoordinatorError(
                ErrorCode.UNKNOWN_TOPIC,
                f"topic(s) {missing} do not exist on {self.config.bootstrap_servers}",
            )
        return counts
