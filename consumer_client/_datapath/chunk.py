"""What the fetcher hands the dispatcher: one partition's records of one fetch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyshard.consumer_client._datapath.progress import Grant
from keyshard.core.model.positions import TopicPartition


@dataclass(slots=True)
class Chunk:
    """Records of one partition, dispatched from `next` on.

    `generation` and `session` are what the fetch was sent under: a rewind or a new
    registration since makes the chunk stale. A chunk of records replayed for a grant
    (`replay`) was not fetched: it has no generation to check. `size`: its records' bytes
    in the memory budget (`_datapath.budget`), counted as waiting while it is queued.
    """

    tp: TopicPartition
    generation: int | None
    session: int
    records: list[Any]
    next: int = 0
    replay: Grant | None = None
    size: int = 0
