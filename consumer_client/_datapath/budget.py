"""The consumer's memory budget: record bytes held, by kind, and how much more to fetch.

A consumer holds records in three places: fetched and waiting to be dispatched (the
backlog, the merge gate), in flight (dispatched to a lane: queued behind their key or
running), and the replay windows. Without a bound they grow with the backlog (a window of
10,000 records per partition is 100 MB of 10 KB records, per partition), so a worker sized
for its usual load is OOM-killed by a backlog, restarts, re-reads it and is killed again.
One budget in record bytes (key + value + headers) bounds them all, as `fetch.max.bytes`
bounds a Kafka consumer:

- fetching goes on while waiting + in flight is below the budget, and stops (pauses)
  when it is used up, until an eighth of it is free again: a batch worth fetching, not
  one record per completed handler;
- a fetched batch is taken up to the record that uses the budget up; the rest is
  fetched again later. So the budget is exceeded by at most one record, and a record
  larger than the whole budget is still taken when it comes first (Kafka's "at least one
  record" rule: a consumer must make progress whatever the record size);
- the replay windows hold what is left (budget - waiting - in flight) and give way
  first: they save a refetch at a handoff, nothing depends on them.

Pure: sizes in, decisions out. The fetcher, the lanes and the windows keep the counts;
the default budget and the Kafka fetch sizes it sets are in `core.kafka.fetch_sizes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def record_size(record: Any) -> int:
    """What a record weighs in the budget: key + value + header names and values. Key and
    value count as serialized, by the sizes aiokafka records as it decodes (-1: none):
    read without touching the data, and right whatever a deserializer made of it; a
    record made elsewhere counts its data's length. The C fast path's `take` counts the
    same (`_fastpath.c`, `record_bytes`)."""
    try:
        key, value = record.serialized_key_size, record.serialized_value_size
    except AttributeError:
        key = value = None
    if type(key) is not int:
        key = _length(record.key)
    if type(value) is not int:
        value = _length(record.value)
    size = (key if key > 0 else 0) + (value if value > 0 else 0)
    for name, data in record.headers or ():
        size += len(name) + _length(data)
    return size


def _length(data: Any) -> int:
    return 0 if data is None else len(data)


def take(records: Sequence[Any], room: int) -> tuple[int, int, int]:
    """How many of `records` to take with `room` bytes left: (count, their bytes, the
    largest of them). Records are taken while the bytes taken before each are below
    `room`: the last one taken may pass it (by at most its own size)."""
    count = taken = largest = 0
    for record in records:
        if taken >= room:
            break
        size = record_size(record)
        taken += size
        largest = max(largest, size)
        count += 1
    return count, taken, largest


@dataclass(slots=True)
class BufferBudget:
    """Record bytes held, by kind, against `limit` (see the module docstring)."""

    limit: int
    waiting: int = 0  # fetched, not dispatched (the backlog, the merge gate)
    in_flight: int = 0  # dispatched to a lane, its handler not complete
    window: int = 0  # held in the replay windows (shares records with the backlog)
    pauses: int = 0  # times fetching stopped because the budget was used up
    largest: int = 0  # the largest record of the last batch taken: sizes the next one
    paused: bool = False

    def used(self) -> int:
        """What fetching is bounded by: the windows give way, so they do not count."""
        return self.waiting + self.in_flight

    def room(self) -> int:
        return self.limit - self.waiting - self.in_flight

    def window_room(self) -> int:
        """What the replay windows may hold now."""
        return max(0, self.limit - self.waiting - self.in_flight)

    def may_fetch(self) -> bool:
        """False from the moment the budget is used up until an eighth of it is free."""
        used = self.used()
        if self.paused:
            if used <= self.limit - self.limit // 8:
                self.paused = False
        elif used >= self.limit:
            self.paused = True
            self.pauses += 1
        return not self.paused

    def batch(self, most: int) -> int:
        """Records to ask the Kafka client for: at most `most`, and about what the room
        holds at the size of the last batch's largest record (a bigger record makes the
        fetcher put the rest back: `take`)."""
        if self.largest <= 0:
            return most
        return max(1, min(most, self.room() // self.largest))
