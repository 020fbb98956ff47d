"""The keyshard consumer library: the whole public API is this module.

`CoordinatedConsumer` is the consumer. `Membership`, `MemberHooks`, `PingReport` and
`TopicsChange` are
for members that fetch on their own terms (the Spark streaming source is one): the
member's side of the protocol without the consumer's data path; `MemberState` is where a
member is in it (`Membership.member.state`).

Everything else is private, grouped by concern: `_membership` (the coordinator channel
and the member's sans-I/O state machine), `_datapath` (fetch, filter, per-key lanes,
positions), `_exactly_once` (transactions), `_operations` (signals, probes, metrics).
"""

from keyshard.consumer_client._consumer import (
    ConsumerAborted,
    ConsumerError,
    ConsumerStats,
    CoordinatedConsumer,
)
from keyshard.consumer_client._datapath.lanes import RetryPolicy
from keyshard.consumer_client._exactly_once.transactions import Outputs
from keyshard.consumer_client._membership.connector import Membership
from keyshard.consumer_client._membership.member_hooks import (
    MemberHooks,
    PingReport,
    TopicsChange,
)
from keyshard.consumer_client._membership.state import MemberState
from keyshard.consumer_client._operations.endpoints import ConsumerEndpoints
from keyshard.core.security.tls import ClientTls

__all__ = [
    "ClientTls",
    "ConsumerAborted",
    "ConsumerEndpoints",
    "ConsumerError",
    "ConsumerStats",
    "CoordinatedConsumer",
    "MemberHooks",
    "MemberState",
    "Membership",
    "Outputs",
    "PingReport",
    "RetryPolicy",
    "TopicsChange",
]
