"""What a replica believes of the state log as it reads it: each record on its own.

* A record is applied alone or skipped alone. One this version cannot read (a value that
  is `[]` or not JSON, an epoch that is no int64, a marker naming another partition) is
  skipped with a log line, and the rest of its fetch batch is applied: a bad record must
  not take the records after it out of the replica's image.
* With a replica secret (`coordinator.storage.signing`), a beat or an epoch marker that
  does not verify is ignored, with a log line: it moves no partition and names no
  address anyone is sent to (`PartitionImage.unverified` keeps only its epoch).
* The log lines are throttled: a topic writer can append records faster than anyone
  reads a log.

Records are aiokafka's `ConsumerRecord`s (key, value, offset, headers); nothing here reads
from Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.log_format import (
    EpochMarker,
    RecordError,
    ReplicaBeat,
    StateRecord,
    decode,
)
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.security.log_safety import ThrottledLog, printable

log = logging.getLogger(__name__)
BEAT_KIND = b"H\x00"


class RecordReader:
    def __init__(self, topic: str, secret: ReplicaSecret | None) -> None:
        self.topic = topic
        self.secret = secret
        self._unreadable = ThrottledLog(log, "unreadable state records", level=logging.ERROR)
        self._unverified = ThrottledLog(log, "state records that did not verify")

    def replay(self, image: PartitionImage, records: Sequence[Any]) -> None:
        """Apply `records` (in offset order) to `image`; beats are not its business."""
        for record in records:
            if record.key is None or record.key.startswith(BEAT_KIND):
                image.next_offset = max(image.next_offset, record.offset + 1)
                continue
            decoded = self._decode(image.partition, record)
            if decoded is None:
                image.next_offset = max(image.next_offset, record.offset + 1)
            elif isinstance(decoded, EpochMarker) and not self._verified(
                image.partition, record, f"epoch marker ({decoded.epoch}, {decoded.replica_id})"
            ):
                image.unverified(record.offset, decoded.epoch)
            else:
                image.apply(record.offset, decoded)

    def beat(self, record: Any) -> ReplicaBeat | None:
        """The beat `record` of partition 0 is, when it is a readable one that verifies."""
        if record.key is None or not record.key.startswith(BEAT_KIND):
            return None
        beat = self._decode(0, record)
        if not isinstance(beat, ReplicaBeat):
            return None
        if not self._verified(0, record, f"beat ({beat.replica_id}, {beat.admin_url})"):
            return None
        return beat

    def _decode(self, partition: int, record: Any) -> StateRecord | None:
        try:
            decoded = decode(record.key, record.value)
            if isinstance(decoded, EpochMarker) and decoded.partition != partition:
                raise RecordError(f"an epoch marker of partition {decoded.partition}")
            if record.key.startswith(BEAT_KIND) and not isinstance(decoded, ReplicaBeat):
                raise RecordError("a beat's key on another kind of record")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self._unreadable(
                "skipping unreadable state record %d/%d: %s: %s",
                partition, record.offset, type(err).__name__, printable(err),
            )  # fmt: skip
            return None
        return decoded

    def _verified(self, partition: int, record: Any, what: str) -> bool:
        if self.secret is None:
            return True
        why = self.secret.failure(self.topic, partition, record.key, record.value, record.headers)
        if why is None:
            return True
        self._unverified(
            "ignoring the %s at %d/%d: it %s",
            printable(what), partition, record.offset, why,
        )  # fmt: skip
        return False

    def flush(self) -> None:
        self._unreadable.flush()
        self._unverified.flush()
