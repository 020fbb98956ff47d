"""The messages of the coordinator <-> consumer protocol, as validated pydantic models.

Every frame carries one JSON object with a ``"type"`` discriminator and a
``"correlation_id"`` (0 <= id < 2**31) that a response echoes, so requests may be
pipelined. Slot ranges are ``[start, end]`` lists, inclusive, within 0..65535. The framing
is `keyshard.core.protocol.codec`'s; the algorithm both ends run is in docs/protocol.md.

Validation is strict (no ``"5"`` for 5, no ``true`` for 1, no unknown fields): the two
ends are built from this one module, so anything lax would only hide a bug.
"""

import re
from collections import Counter
from enum import StrEnum
from typing import Annotated, Literal, Self, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from keyshard.core.model.addresses import parse_host_port
from keyshard.core.model.hashing import MAX_SLOT

_NAME_PATTERN = r"^[A-Za-z0-9._-]+$"  # Kafka's legal topic characters
#: Upper bounds of every number on the wire, Kafka's own types: an offset is an int64, a
#: partition, an epoch and a count an int32. A peer's 10**400 is then an INVALID_MESSAGE,
#: never a Python integer that overflows a float somewhere in the coordinator.
MAX_OFFSET = 2**63 - 1
MAX_INT32 = 2**31 - 1


class ErrorCode(StrEnum):
    MALFORMED_FRAME = "MALFORMED_FRAME"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    UNKNOWN_GROUP = "UNKNOWN_GROUP"
    UNKNOWN_TOPIC = "UNKNOWN_TOPIC"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"
    FENCED_MEMBER = "FENCED_MEMBER"
    STALE_EPOCH = "STALE_EPOCH"
    NOT_COORDINATOR = "NOT_COORDINATOR"
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
    # The principal lacks Read on the group or on a topic (docs/protocol.md §4.3).
    AUTHORIZATION_FAILED = "AUTHORIZATION_FAILED"
    INCONSISTENT_TOPICS = "INCONSISTENT_TOPICS"
    INVALID_RANGES = "INVALID_RANGES"
    UNEXPECTED_MESSAGE = "UNEXPECTED_MESSAGE"
    INTERNAL = "INTERNAL"
    # Refusals of a connection rather than of a request (docs/protocol.md, §3.1).
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    REGISTER_TIMEOUT = "REGISTER_TIMEOUT"
    TLS_REQUIRED = "TLS_REQUIRED"
    # A consumer refusing a request from an older coordinator than one it has heard from
    # (a fenced replica; docs/protocol.md §7.3).
    STALE_COORDINATOR = "STALE_COORDINATOR"
    # Register refused by a server bound (docs/protocol.md §4.3): Kafka's
    # INVALID_SESSION_TIMEOUT and GROUP_MAX_SIZE_REACHED, and a replica's group cap.
    INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    TOO_MANY_GROUPS = "TOO_MANY_GROUPS"


# --------------------------------------------------------------------------- field types

MAX_CONSUMER_NAME = 255


def _check_slot_range(value: tuple[int, int]) -> tuple[int, int]:
    start, end = value
    if not (0 <= start <= MAX_SLOT and 0 <= end <= MAX_SLOT):
        raise ValueError(f"slot range [{start}, {end}]: slots must be within 0..{MAX_SLOT}")
    if start > end:
        raise ValueError(f"slot range [{start}, {end}]: start > end")
    return value


WireRange: TypeAlias = Annotated[tuple[int, int], AfterValidator(_check_slot_range)]
"""Inclusive ``[start, end]`` slot range. A tuple (not a model) so it is a bare
2-element JSON list on the wire, which keeps position-heavy frames compact."""

_Name: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=249, pattern=_NAME_PATTERN)
]
_Offset: TypeAlias = Annotated[int, Field(ge=0, le=MAX_OFFSET)]
_Partition: TypeAlias = Annotated[int, Field(ge=0, le=MAX_INT32)]
_Epoch: TypeAlias = Annotated[int, Field(ge=0, le=MAX_INT32)]
_Count: TypeAlias = Annotated[int, Field(ge=0, le=MAX_INT32)]


def _check_unique_topics(topics: list[str]) -> list[str]:
    if duplicates := [topic for topic, n in Counter(topics).items() if n > 1]:
        raise ValueError(f"duplicate topics: {', '.join(map(repr, duplicates[:5]))}")
    return topics


_LINE_BREAKING = frozenset("\u2028\u2029")  # line and paragraph separators


def check_one_line(name: str) -> str:
    """A name a client chooses goes into member ids and log lines: no control character
    (a newline in it would forge a log line of its own) and no line separator."""
    for i, c in enumerate(name):
        if c < " " or "\x7f" <= c <= "\x9f" or c in _LINE_BREAKING:
            raise ValueError(
                f"a name must not contain control characters or line breaks ({c!r} at {i})"
            )
    return name


_OneLine: TypeAlias = Annotated[str, AfterValidator(check_one_line)]
"""Text a client chooses that the coordinator logs: a consumer name, a member id."""


def _check_pattern(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as err:
        raise ValueError(f"topic pattern {pattern!r} is not a regular expression: {err}") from None
    return pattern


TopicPattern: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=1000), AfterValidator(_check_pattern)
]
"""A regular expression (Python `re`) a topic's whole name must match, as Kafka's
`subscribe(Pattern)`."""


def _check_host_port(address: str) -> str:
    try:
        parse_host_port(address)
    except ValueError as err:
        raise ValueError(f"address {err}") from None
    return address


class _WireModel(BaseModel):
    """Frozen because a decoded message is a fact about what the peer said; extra
    fields are forbidden so a misspelt optional field fails loudly instead of being
    silently dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid")


_Interval: TypeAlias = tuple[_Offset, _Offset]  # half-open [a, b) offset interval


class PositionModel(_WireModel):
    """Consumption position in one slot range of one partition.

    Everything below ``next_offset`` is done. ``acked`` holds half-open ``[a, b)``
    offset intervals done out of order above it; they are what lets a range move to
    another member without redelivering work that already finished. The invariants
    are checked here so the coordinator's merge code can rely on them.
    """

    next_offset: _Offset
    acked: list[_Interval] = Field(default_factory=list)

    @field_validator("acked")
    @classmethod
    def _check_acked(cls, acked: list[_Interval], info: ValidationInfo) -> list[_Interval]:
        next_offset = info.data.get("next_offset")  # absent if it failed validation
        previous: _Interval | None = None
        for a, b in acked:
            if a >= b:
                raise ValueError(f"acked interval [{a}, {b}) is empty (start must be < end)")
            if next_offset is not None and a <= next_offset:
                raise ValueError(
                    f"acked interval [{a}, {b}) does not start above next_offset {next_offset}"
                )
            if previous is not None and previous[1] > a:
                raise ValueError(
                    f"acked intervals [{previous[0]}, {previous[1]}) and [{a}, {b}) "
                    "overlap or are out of order"
                )
            previous = (a, b)
        return acked


class RangePosition(_WireModel):
    range: WireRange
    position: PositionModel


class PartitionPositions(_WireModel):
    topic: str = Field(min_length=1, max_length=249)
    partition: _Partition
    ranges: list[RangePosition]


# --------------------------------------------------------------------------- messages


class _WireMessage(_WireModel):
    correlation_id: int = Field(ge=0, lt=2**31)


class MetadataRequest(_WireMessage):
    type: Literal["metadata_request"] = "metadata_request"
    # Which coordinator serves this group (replicas share the groups); none: this one.
    group: _Name | None = None


class MetadataResponse(_WireMessage):
    type: Literal["metadata_response"] = "metadata_response"
    coordinator_id: str
    coordinator: Annotated[str, AfterValidator(_check_host_port)]
    active: bool
    # The coordinator epoch of the group's state partition (0: none yet).
    coordinator_epoch: _Epoch = 0


class MemberClaim(_WireModel):
    """What a member that lost its coordinator still runs, to keep it with no pause:
    its id and epoch, the ranges it owns and their exact positions (docs/protocol.md §7.4)."""

    member_id: _OneLine = Field(min_length=1, max_length=300)
    member_epoch: _Epoch
    owned: list[WireRange]
    positions: list[PartitionPositions]
    coordinator_epoch: _Epoch


class RegisterRequest(_WireMessage):
    type: Literal["register_request"] = "register_request"
    group: _Name
    # Exactly one of the two: topics by name, or every topic whose name matches.
    topics: Annotated[list[_Name], AfterValidator(_check_unique_topics)] = Field(
        default_factory=list
    )
    topic_pattern: TopicPattern | None = None
    consumer_id: str | None = None
    consumer_name: _OneLine = Field(min_length=1, max_length=MAX_CONSUMER_NAME)
    session_timeout_ms: int = Field(ge=1000, le=300_000)
    capacity: int = Field(default=1, ge=1, le=100_000)
    fixed_ranges: list[WireRange] | None = None
    # repr=False: keeps the credential out of logs that print messages.
    auth_token: str | None = Field(default=None, max_length=4096, repr=False)
    claim: MemberClaim | None = None

    @model_validator(mode="after")
    def _one_subscription(self) -> Self:
        if bool(self.topics) == (self.topic_pattern is not None):
            raise ValueError("give either topics (at least one) or topic_pattern, not both")
        return self


class RegisterResponse(_WireMessage):
    type: Literal["register_response"] = "register_response"
    member_id: str
    member_epoch: _Epoch
    ping_interval_ms: int
    session_timeout_ms: int
    # With a claim: the ranges it keeps (it stops any other it still runs, at once).
    adopted: list[WireRange] = Field(default_factory=list)
    coordinator_epoch: _Epoch = 0


class PingRequest(_WireMessage):
    type: Literal["ping_request"] = "ping_request"
    member_epoch: _Epoch
    coordinator_epoch: _Epoch = 0


class HighWatermark(_WireModel):
    """A partition's end as the consumer's own fetches last saw it: the lag reference
    (ListOffsets can under-report on some brokers, the fetch response does not).

    `stable`: the offset is the last stable offset, the end a read_committed consumer can
    read to while a transaction is open (the high watermark when `stable` is false)."""

    topic: str = Field(min_length=1, max_length=249)
    partition: _Partition
    offset: _Offset
    stable: bool = False


class FetchedWindow(_WireModel):
    """What the member's fetches brought in one partition since its last Ping reply:
    offsets [start, end) examined, and how many records of each load bucket were among
    them, owned or not. Demand the coordinator can see before anyone processes it (the
    backlog's key distribution); every member reading a partition sees the same records,
    so the coordinator merges windows by offset instead of adding them up."""

    topic: str = Field(min_length=1, max_length=249)
    partition: _Partition
    start: _Offset
    end: _Offset
    buckets: dict[Annotated[int, Field(ge=0, le=4095)], _Count] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.end < self.start:
            raise ValueError(f"fetched window ends ({self.end}) before it starts ({self.start})")
        return self


class FetchSilence(_WireModel):
    """How long ago the member's fetches of one partition last succeeded (an answer from
    Kafka, records or not), in milliseconds: how a member cut off from Kafka says so."""

    topic: str = Field(min_length=1, max_length=249)
    partition: _Partition
    ms: _Count


class PingResponse(_WireMessage):
    type: Literal["ping_response"] = "ping_response"
    member_epoch: _Epoch
    positions: list[PartitionPositions] = Field(default_factory=list)
    high_watermarks: list[HighWatermark] = Field(default_factory=list)
    # load bucket (0..4095, 16 slots each) -> records processed since the last ping.
    load: dict[Annotated[int, Field(ge=0, le=4095)], _Count] = Field(default_factory=dict)
    fetched: list[FetchedWindow] = Field(default_factory=list)
    # Records completed by handlers that held a lane since the last reply, and the time
    # they held lanes, in milliseconds of the member's whole concurrency (lane-time /
    # max_concurrency): its measured speed (docs/protocol.md §8.7). None: not reported.
    busy_records: _Count = 0
    busy_ms: _Count | None = None
    # Per partition the member fetches: since when no fetch of it succeeded (§7.6).
    fetch_silences: list[FetchSilence] = Field(default_factory=list)


class StopFetcherRequest(_WireMessage):
    type: Literal["stop_fetcher_request"] = "stop_fetcher_request"
    member_epoch: _Epoch
    ranges: list[WireRange] = Field(min_length=1)
    coordinator_epoch: _Epoch = 0


class StopFetcherResponse(_WireMessage):
    type: Literal["stop_fetcher_response"] = "stop_fetcher_response"
    member_epoch: _Epoch
    positions: list[PartitionPositions]


class PartitionRef(_WireModel):
    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0)


class PartitionTransition(_WireModel):
    """A topic whose partition count changed lately (docs/protocol.md §9.5): a producer
    may still write a key to the partition the old count gave it until `until_ms`, so
    records of the topic up to that timestamp are admitted in timestamp order."""

    topic: str = Field(min_length=1, max_length=249)
    # The partition counts the topic went through, oldest first; the last is the current.
    counts: list[Annotated[int, Field(ge=1)]] = Field(min_length=2, max_length=64)
    until_ms: int = Field(ge=0)  # a record timestamp (ms since the epoch)


class StartFetcherRequest(_WireMessage):
    type: Literal["start_fetcher_request"] = "start_fetcher_request"
    member_epoch: _Epoch
    ranges: list[WireRange] = Field(min_length=1)
    positions: list[PartitionPositions]
    coordinator_epoch: _Epoch = 0
    # Topics in transition (§9.5), in every StartFetcher while one lasts.
    transitions: list[PartitionTransition] = Field(default_factory=list)
    # Partitions no longer in the group (their topic was deleted or no longer matches):
    # stop fetching them and forget their positions.
    dropped: list[PartitionRef] = Field(default_factory=list)


class StartFetcherResponse(_WireMessage):
    type: Literal["start_fetcher_response"] = "start_fetcher_response"
    member_epoch: _Epoch


class LeaveRequest(_WireMessage):
    type: Literal["leave_request"] = "leave_request"
    member_id: _OneLine = Field(min_length=1, max_length=300)
    member_epoch: _Epoch
    positions: list[PartitionPositions]


class LeaveResponse(_WireMessage):
    type: Literal["leave_response"] = "leave_response"


class ErrorResponse(_WireMessage):
    type: Literal["error_response"] = "error_response"
    code: ErrorCode
    message: str


Message: TypeAlias = Annotated[
    MetadataRequest
    | MetadataResponse
    | RegisterRequest
    | RegisterResponse
    | PingRequest
    | PingResponse
    | StopFetcherRequest
    | StopFetcherResponse
    | StartFetcherRequest
    | StartFetcherResponse
    | LeaveRequest
    | LeaveResponse
    | ErrorResponse,
    Field(discriminator="type"),
]

# Derived from the union (by the naming convention every class here follows) so a
# new message type cannot be added to the wire and forgotten in these tuples.
_MESSAGE_CLASSES: tuple[type[BaseModel], ...] = get_args(get_args(Message)[0])
REQUEST_TYPES = tuple(cls for cls in _MESSAGE_CLASSES if cls.__name__.endswith("Request"))
RESPONSE_TYPES = tuple(cls for cls in _MESSAGE_CLASSES if cls.__name__.endswith("Response"))


def is_response(msg: Message) -> bool:
    """Both ends read one socket carrying requests and responses (the coordinator
    sends StopFetcher/StartFetcher requests to consumers), so the reader needs to
    tell which pending-request table a message belongs to."""
    return isinstance(msg, RESPONSE_TYPES)
