"""What the tests and the benchmarks both run on: real brokers, real processes, and the
measures and checks their reports share. A development tool of this repository, not a
part of keyshard: the wheel has only `keyshard`, and nothing in it imports this.

- brokers: `harness.brokers` (Tansu, or Apache Kafka from Maven Central in
  `harness.brokers.kafka`);
- processes: `CoordinatorProcess`, `ReplicaSet`, `Workers` (free ports, stopped by pid),
  `cpu_seconds` and `rss_mib` of a pid; `harness.eos_app`, the exactly-once app;
  `BUSY_COORDINATOR`, a coordinator whose event loop a signal holds;
- topics and records: `create_topic`, `produce`, `append` (raw records, as a topic writer);
- waiting: `wait_for`, on a condition with a deadline;
- networks: `CuttableProxy`, a TCP route a test cuts (silently: no reset) and heals;
- groups: `is_settled` (the one settle check), `owned_ranges`, `unsettled_reason`;
- Kafka's own failovers: the scenario's `KeyedGroup`, `BrokerStep`s run on a 3-node
  cluster (`run_steps`, a step's node `leader` of a partition or fixed), `PlainReader`
  (Kafka's own availability), `longest_stop`, `issue_schedule`;
- reports: `order_stats` (per-key order from handler logs), `median`, `percentile`,
  `markdown_table`.
"""

from harness._groups import is_settled, owned_ranges, unsettled_reason
from harness._kafka_failover import (
    BrokerStep,
    KeyedGroup,
    PlainReader,
    issue_schedule,
    leader,
    longest_stop,
    run_steps,
)
from harness._order import OrderStats, order_stats
from harness._processes import (
    BUSY_COORDINATOR,
    CoordinatorProcess,
    ReplicaSet,
    Workers,
    cpu_seconds,
    rss_mib,
)
from harness._proxy import CuttableProxy
from harness._stats import median, percentile
from harness._tables import markdown_table
from harness._topics import append, create_topic, produce
from harness._waiting import wait_for
from keyshard.local.demo import GROUP, TOPIC

__all__ = [
    "BUSY_COORDINATOR",
    "GROUP",
    "TOPIC",
    "BrokerStep",
    "CoordinatorProcess",
    "CuttableProxy",
    "KeyedGroup",
    "OrderStats",
    "PlainReader",
    "ReplicaSet",
    "Workers",
    "append",
    "cpu_seconds",
    "create_topic",
    "is_settled",
    "issue_schedule",
    "leader",
    "longest_stop",
    "markdown_table",
    "median",
    "order_stats",
    "owned_ranges",
    "percentile",
    "produce",
    "rss_mib",
    "run_steps",
    "unsettled_reason",
    "wait_for",
]
