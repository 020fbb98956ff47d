"""Planning of keyshard reads: pure values, no Spark, no Kafka.

A Spark partition of the `keyshard` source is a `ReadSlice`: one topic-partition and a set
of slot segments, each with two `Position`s: `lower` (done before this batch) and `upper`
(done once this batch is done). The slice's records are, per segment, the offsets done in
`upper` but not in `lower`: the topic-partition is read from the lowest `lower` next offset
up to the highest `upper` next offset, keeping only records whose slot falls in a segment.
Acknowledged-ahead offsets handed over with a range are in `lower`, so they are skipped
the same way the consumer client skips them.

Each slice is read by one task, in offset order, so per-key order holds inside a task; a
slice covers a slot range, not an offset range, so splitting a partition never splits a key.
"""

from __future__ import annotations

import json
import os
import warnings
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyshard.core.model.durations import deprecated, pick_ms
from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.positions import Position, TopicPartition
from keyshard.core.model.ranges import SlotRange
from keyshard.core.security.secret_files import SecretFileError, secret_from
from keyshard.core.security.tls import ClientTls, TlsConfigError, TlsNames

EARLIEST = -2  # starting_positions sentinels, as in Spark's Kafka source
LATEST = -1


class SourceError(ValueError):
    """Bad options or an impossible read; the message names the option or partition."""


# ---- slot ranges ----------------------------------------------------------------------


def equal_ranges(count: int) -> list[SlotRange]:
    """`count` contiguous, equal (to within one slot) slices of the slot space."""
    if not 1 <= count <= SLOT_COUNT:
        raise SourceError(f"ranges={count} is outside 1..{SLOT_COUNT}")
    bounds = [i * SLOT_COUNT // count for i in range(count + 1)]
    return [SlotRange(bounds[i], bounds[i + 1] - 1) for i in range(count)]


# ---- slices ---------------------------------------------------------------------------

Segment = tuple[SlotRange, Position, Position]  # slots, lower, upper


@dataclass(frozen=True, slots=True)
class ReadSlice:
    topic: str
    partition: int
    segments: tuple[Segment, ...]  # disjoint, sorted by slot

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def until(self) -> int:
        """Exclusive offset bound of the read."""
        return max((upper.next_offset for _, _, upper in self.segments), default=0)

    @property
    def from_offset(self) -> int:
        return min((lower.next_offset for _, lower, _ in self.segments), default=self.until)

    @property
    def is_empty(self) -> bool:
        return self.from_offset >= self.until

    def slot_filter(self) -> SlotFilter:
        return SlotFilter(self.segments)


class SlotFilter:
    """Fast "does this slice want (slot, offset)?" for the executor's hot loop."""

    __slots__ = ("_ends", "_lowers", "_starts", "_uppers")

    def __init__(self, segments: Iterable[Segment]) -> None:
        ordered = sorted(segments, key=lambda s: s[0].start)
        self._starts = [seg.start for seg, _, _ in ordered]
        self._ends = [seg.end for seg, _, _ in ordered]
        self._lowers = [lower for _, lower, _ in ordered]
        self._uppers = [upper for _, _, upper in ordered]

    def wants(self, slot: int, offset: int) -> bool:
        i = bisect_right(self._starts, slot) - 1
        if i < 0 or slot > self._ends[i]:
            return False
        return self._uppers[i].is_done(offset) and not self._lowers[i].is_done(offset)


def plan_batch(
    bounds: Mapping[TopicPartition, tuple[int, int]], ranges: Sequence[SlotRange]
) -> list[ReadSlice]:
    """One slice per (topic-partition x slot range) with records in [from, until)."""
    slices = []
    for (topic, partition), (start, until) in sorted(bounds.items()):
        if start >= until:
            continue
        for r in ranges:
            slices.append(ReadSlice(topic, partition, ((r, Position(start), Position(until)),)))
    return slices


# ---- options --------------------------------------------------------------------------


def require(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if value is None or not str(value).strip():
        raise SourceError(f"option {name!r} is required")
    return str(value).strip()


def parse_topics(options: Mapping[str, str]) -> list[str]:
    topics = [t.strip() for t in require(options, "topics").split(",")]
    if any(not t for t in topics):
        raise SourceError(f"option 'topics' has an empty name: {options['topics']!r}")
    return list(dict.fromkeys(topics))


def parse_int(
    options: Mapping[str, str], name: str, default: int, low: int, high: int | None = None
) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SourceError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f"..{high}"
        raise SourceError(f"option {name!r}={value} is outside {low}{upper}")
    return value


def parse_ms(options: Mapping[str, str], name: str, default: int) -> int:
    """A duration option, `name` ending in `_ms`: whole milliseconds, at least 1. Its
    deprecated name in whole seconds (`_s` for `_ms`) is taken for one release, with a
    `FutureWarning` (shown by default: Spark, not the query's code, reads the options);
    both names given is a `SourceError`."""
    old = name.removesuffix("_ms") + "_s"
    ms = parse_int(options, name, default, 1) if name in options else None
    seconds = parse_int(options, old, 1, 1) if old in options else None
    try:
        value = pick_ms(ms, seconds, new=repr(name), old=repr(old))
    except ValueError as err:
        raise SourceError(f"option {err}") from None
    if seconds is not None:
        message = deprecated(f"option {old!r}", f"{name!r}")
        warnings.warn(f"keyshard source: {message}", FutureWarning, stacklevel=2)
    return default if value is None else value


def parse_coordinator_tls(options: Mapping[str, str]) -> ClientTls | None:
    """`coordinator_tls_ca_file` (and optionally `coordinator_tls_cert_file`,
    `coordinator_tls_key_file`): the coordinator's channel runs TLS. The files are read
    now, so a wrong path fails the query at once, naming the option."""
    files = {
        part: options.get(f"coordinator_tls_{part}_file") or None for part in ("ca", "cert", "key")
    }
    if files["ca"] is None:
        if files["cert"] or files["key"]:
            raise SourceError(
                "option 'coordinator_tls_ca_file' is required with a client certificate"
            )
        return None
    tls = ClientTls(files["ca"], files["cert"], files["key"])
    try:
        tls.context(
            TlsNames(*(f"option 'coordinator_tls_{p}_file'" for p in ("ca", "cert", "key")))
        )
    except TlsConfigError as err:
        raise SourceError(str(err)) from None
    return tls


def parse_auth_token(
    options: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> str | None:
    """The coordinator's token: the file `auth_token_file` names, else `auth_token`, else
    the driver's KEYSHARD_AUTH_TOKEN. (Spark redacts an option named like a token in its
    UI and logs; a file keeps it out of the query's code altogether.)"""
    try:
        token, _ = secret_from(
            options.get("auth_token"),
            options.get("auth_token_file") or None,
            flag="option 'auth_token'",
            file_flag="option 'auth_token_file'",
            env_value=None,
        )
    except SecretFileError as err:
        raise SourceError(str(err)) from None
    return token if token is not None else environ.get("KEYSHARD_AUTH_TOKEN")


def parse_starting_positions(raw: str | None, topics: Sequence[str]) -> dict[TopicPartition, int]:
    """`{"topic": {"0": 42, "1": -2}}` -> {(topic, 0): 42, (topic, 1): EARLIEST}.

    The format of Spark's Kafka `startingOffsets`: -2 is the earliest offset, -1 the high
    watermark; partitions not named start at the earliest offset.
    """
    if raw is None:
        return {}
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as err:
        raise SourceError(f"option 'starting_positions' is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise SourceError(
            'option \'starting_positions\' must be an object like {"topic": {"0": 42}}'
        )
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if topic not in topics:
            raise SourceError(f"starting_positions names topic {topic!r}, not in 'topics'")
        if not isinstance(parts, dict):
            raise SourceError(f"starting_positions[{topic!r}] must map partition -> offset")
        for partition, offset in parts.items():
            if not str(partition).isdigit():
                raise SourceError(f"starting_positions[{topic!r}]: bad partition {partition!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise SourceError(
                    f"starting_positions[{topic!r}][{partition!r}]: offset must be an "
                    f"integer >= 0, or -2 (earliest) / -1 (latest), got {offset!r}"
                )
            out[(topic, int(partition))] = offset
    return out


def resolve_start(
    watermarks: Mapping[TopicPartition, tuple[int, int]],
    starting: Mapping[TopicPartition, int],
) -> dict[TopicPartition, tuple[int, int]]:
    """(low, high) watermarks + requested starts -> (from, until) per topic-partition."""
    unknown = sorted(set(starting) - set(watermarks))
    if unknown:
        raise SourceError(f"starting_positions names partitions that do not exist: {unknown}")
    out = {}
    for tp, (low, high) in watermarks.items():
        start = starting.get(tp, EARLIEST)
        if start == EARLIEST:
            start = low
        elif start == LATEST:
            start = high
        elif not low <= start <= high:
            raise SourceError(
                f"starting position {start} of {tp[0]}/{tp[1]} is outside the "
                f"partition's offsets {low}..{high}"
            )
        out[tp] = (start, high)
    return out
