"""The consumer's counters, for read-amplification and throughput measurements."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class ConsumerStats:
    """Counters since start.

    `fetched` counts every record aiokafka decoded for us (including the ones another
    consumer owns and the ones refetched after a rewind); `admitted` the ones handed to a
    lane; `processed` the handler completions acknowledged. A grant below the fetch
    position either replays held records (`replayed` counts them) or seeks the partition
    back (`rewinds`).
    """

    fetched: int = 0
    admitted: int = 0
    processed: int = 0
    replayed: int = 0
    rewinds: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
