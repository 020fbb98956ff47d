"""The brokers tests and benchmarks run against: Tansu (`keyshard.local.broker`, the
embedded broker the demo runs too) and Apache Kafka 4.x assembled from Maven Central
(`harness.brokers.kafka`; `python -m harness.brokers.kafka` collects its jars).

`harness.brokers.kafka` is imported where a Kafka node is wanted, not here: imported by
this package, `python -m harness.brokers.kafka` would run a module already imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from keyshard.local.broker import EmbeddedBroker

if TYPE_CHECKING:
    from harness.brokers.kafka import KafkaBroker

#: The kinds of broker there are, by the names `--broker` options and test ids use.
BROKER_KINDS = ("tansu", "kafka")


class Broker(Protocol):
    """What a test needs of a broker, whichever kind."""

    @property
    def bootstrap_servers(self) -> str: ...


def new_broker(kind: str, workdir: Path | None = None) -> EmbeddedBroker | KafkaBroker:
    """A broker of `kind`, not started: a fresh in-memory Tansu on a free port, or an
    Apache Kafka node in `workdir` (default: a directory of its own, removed on stop)."""
    if kind == "tansu":
        return EmbeddedBroker()
    if kind == "kafka":
        from harness.brokers.kafka import KafkaBroker

        return KafkaBroker(workdir=workdir)
    raise ValueError(f"no broker kind {kind!r}: one of {', '.join(BROKER_KINDS)}")


@contextlib.contextmanager
def running_broker(
    kind: str, workdir: Path | None = None
) -> Iterator[EmbeddedBroker | KafkaBroker]:
    """A started broker of `kind` (`new_broker`), stopped on the way out."""
    broker = new_broker(kind, workdir)
    broker.start()
    try:
        yield broker
    finally:
        stop_broker(broker)


def stop_broker(broker: EmbeddedBroker | KafkaBroker) -> None:
    """Stop politely, and whatever goes wrong meanwhile, leave no broker process behind."""
    try:
        broker.stop()
    finally:
        if broker.running:
            broker.kill()  # reaps
