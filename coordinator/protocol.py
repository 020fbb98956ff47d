"""Coordinator <-> consumer socket protocol: message models and a sans-IO frame codec.

Wire format (every message, both directions)::

    +----------------------+-----------+------------------------------+
    | length L: uint32, BE | version:1 | JSON object (UTF-8), L-1 B   |
    +----------------------+-----------+------------------------------+

* ``L`` counts the bytes after the length field (version byte + JSON), so a
  reader knows how much to wait for without scanning. ``2 <= L <= max_frame_bytes``
  (default :data:`DEFAULT_MAX_FRAME_BYTES`, 1 MiB); the check runs as soon as the
  4 header bytes arrive, so a hostile or buggy peer cannot make us buffer a huge body.
* ``version`` is :data:`PROTOCOL_VERSION`. It is per frame rather than negotiated
  once so a future version can be rolled out without a handshake message.
* The JSON object carries a ``"type"`` discriminator and a ``"correlation_id"``
  (0 <= id < 2**31) that a response echoes, so requests may be pipelined.
  Slot ranges are ``[start, end]`` lists, inclusive, within 0..65535.

JSON rather than a binary schema: the messages are small and infrequent (control
plane only; records never cross this socket), and being able to read a frame in a
packet capture is worth more than the bytes saved.

Decoding is strict (no ``"5"`` for 5, no ``true`` for 1, no unknown fields): the two
ends are built from this one module, so anything lax would only hide a bug.
"""

import struct
from collections import Counter
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticSerializationError, from_json

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "ErrorCode",
    "ErrorResponse",
    "FrameDecoder",
    "HighWatermark",
    "LeaveRequest",
    "LeaveResponse",
    "Message",
    "MetadataRequest",
    "MetadataResponse",
    "PartitionPositions",
    "PingRequest",
    "PingResponse",
    "PositionModel",
    "ProtocolError",
    "RangePosition",
    "RegisterRequest",
    "RegisterResponse",
    "SlotRangeModel",
    "StartFetcherRequest",
    "StartFetcherResponse",
    "StopFetcherRequest",
    "StopFetcherResponse",
    "WireRange",
    "encode",
    "is_response",
]

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 1 << 20

_HEADER = struct.Struct(">I")
_MIN_FRAME_BYTES = 2  # version byte + at least one byte of JSON
_MAX_SLOT = 65535
_NAME_PATTERN = r"^[A-Za-z0-9._-]+$"  # Kafka's legal topic characters
_MAX_REPORTED_ERRORS = 5
_MAX_LOC_PART = 64  # dict keys / extra field names in error paths come from the peer
_MAX_ERROR_MESSAGE = 1000
_JSON_KINDS = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


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
    INCONSISTENT_TOPICS = "INCONSISTENT_TOPICS"
    INVALID_RANGES = "INVALID_RANGES"
    UNEXPECTED_MESSAGE = "UNEXPECTED_MESSAGE"
    INTERNAL = "INTERNAL"


# --------------------------------------------------------------------------- field types


def _check_slot_range(value: tuple[int, int]) -> tuple[int, int]:
    start, end = value
    if not (0 <= start <= _MAX_SLOT and 0 <= end <= _MAX_SLOT):
        raise ValueError(f"slot range [{start}, {end}]: slots must be within 0..{_MAX_SLOT}")
    if start > end:
        raise ValueError(f"slot range [{start}, {end}]: start > end")
    return value


WireRange: TypeAlias = Annotated[tuple[int, int], AfterValidator(_check_slot_range)]
"""Inclusive ``[start, end]`` slot range. A tuple (not a model) so it is a bare
2-element JSON list on the wire, which keeps position-heavy frames compact."""

SlotRangeModel: TypeAlias = WireRange

_Name: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=249, pattern=_NAME_PATTERN)
]


def _check_unique_topics(topics: list[str]) -> list[str]:
    if duplicates := [topic for topic, n in Counter(topics).items() if n > 1]:
        raise ValueError(f"duplicate topics: {', '.join(map(repr, duplicates[:5]))}")
    return topics


def _check_host_port(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {address[:300]!r} is not host:port")
    return address


class _WireModel(BaseModel):
    """Frozen because a decoded message is a fact about what the peer said; extra
    fields are forbidden so a misspelt optional field fails loudly instead of being
    silently dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid")


_Interval: TypeAlias = tuple[int, int]  # half-open [a, b) offset interval


class PositionModel(_WireModel):
    """Consumption position in one slot range of one partition.

    Everything below ``next_offset`` is done. ``acked`` holds half-open ``[a, b)``
    offset intervals done out of order above it; they are what lets a range move to
    another member without redelivering work that already finished. The invariants
    are checked here so the coordinator's merge code can rely on them.
    """

    next_offset: int = Field(ge=0)
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
    partition: int = Field(ge=0)
    ranges: list[RangePosition]


# --------------------------------------------------------------------------- messages


class _WireMessage(_WireModel):
    correlation_id: int = Field(ge=0, lt=2**31)


class MetadataRequest(_WireMessage):
    type: Literal["metadata_request"] = "metadata_request"


class MetadataResponse(_WireMessage):
    type: Literal["metadata_response"] = "metadata_response"
    coordinator_id: str
    coordinator: Annotated[str, AfterValidator(_check_host_port)]
    active: bool


class RegisterRequest(_WireMessage):
    type: Literal["register_request"] = "register_request"
    group: _Name
    topics: Annotated[list[_Name], Field(min_length=1), AfterValidator(_check_unique_topics)]
    consumer_id: str | None = None
    consumer_name: str = Field(min_length=1, max_length=255)
    session_timeout_ms: int = Field(ge=1000, le=300_000)
    capacity: int = Field(default=1, ge=1, le=100_000)
    fixed_ranges: list[WireRange] | None = None
    # repr=False: keeps the credential out of logs that print messages.
    auth_token: str | None = Field(default=None, max_length=4096, repr=False)


class RegisterResponse(_WireMessage):
    type: Literal["register_response"] = "register_response"
    member_id: str
    member_epoch: int
    ping_interval_ms: int
    session_timeout_ms: int


class PingRequest(_WireMessage):
    type: Literal["ping_request"] = "ping_request"
    member_epoch: int


class HighWatermark(_WireModel):
    """A partition's end as the consumer's own fetches last saw it: the lag reference
    (ListOffsets can under-report on some brokers, the fetch response does not)."""

    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class PingResponse(_WireMessage):
    type: Literal["ping_response"] = "ping_response"
    member_epoch: int
    positions: list[PartitionPositions] = Field(default_factory=list)
    high_watermarks: list[HighWatermark] = Field(default_factory=list)
    # load bucket (0..4095, 16 slots each) -> records processed since the last ping.
    load: dict[Annotated[int, Field(ge=0, le=4095)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict
    )


class StopFetcherRequest(_WireMessage):
    type: Literal["stop_fetcher_request"] = "stop_fetcher_request"
    member_epoch: int
    ranges: list[WireRange] = Field(min_length=1)


class StopFetcherResponse(_WireMessage):
    type: Literal["stop_fetcher_response"] = "stop_fetcher_response"
    member_epoch: int
    positions: list[PartitionPositions]


class StartFetcherRequest(_WireMessage):
    type: Literal["start_fetcher_request"] = "start_fetcher_request"
    member_epoch: int
    ranges: list[WireRange] = Field(min_length=1)
    positions: list[PartitionPositions]


class StartFetcherResponse(_WireMessage):
    type: Literal["start_fetcher_response"] = "start_fetcher_response"
    member_epoch: int


class LeaveRequest(_WireMessage):
    type: Literal["leave_request"] = "leave_request"
    member_id: str
    member_epoch: int
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

# Built once: constructing the validator for a 13-way union is the expensive part.
_MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)

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


# --------------------------------------------------------------------------- errors


class ProtocolError(Exception):
    """The peer (or we) broke the protocol. Carries an :class:`ErrorCode` so the
    transport can answer with an :class:`ErrorResponse` before closing, instead of
    the peer seeing only a reset connection.

    ``correlation_id`` is the offending request's id when it could be recovered
    (the JSON parsed but did not validate), else 0. ``decoded`` holds the messages
    that completed earlier in the same :meth:`FrameDecoder.feed` call: they were
    valid, and a transport may still want to act on them (e.g. a LeaveRequest
    carrying positions) before it reports the error.
    """

    def __init__(self, code: ErrorCode, message: str, *, correlation_id: int = 0) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.correlation_id = correlation_id
        self.decoded: tuple[Message, ...] = ()

    def to_response(self, correlation_id: int | None = None) -> ErrorResponse:
        """Defaults to the correlation id recovered from the bad frame, so the
        common transport call ``err.to_response()`` answers the right request."""
        cid = self.correlation_id if correlation_id is None else correlation_id
        return ErrorResponse(correlation_id=cid, code=self.code, message=self.message)


# --------------------------------------------------------------------------- codec


def encode(
    message: Message,
    *,
    version: int = PROTOCOL_VERSION,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> bytes:
    """Serialise one message to a complete frame.

    The size limit is enforced on the sending side too so an oversized message
    (say, positions for thousands of ranges) fails here with a clear error rather
    than killing the connection when the peer rejects it. ``version`` exists for
    tests and for talking to an older peer during a rollout.
    """
    try:
        payload = message.model_dump_json().encode("utf-8")
    except PydanticSerializationError as exc:  # e.g. a lone surrogate in a str field
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, f"cannot encode {message.type} message: {exc}"
        ) from exc
    length = 1 + len(payload)
    if length > max_frame_bytes:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {length} bytes exceeds the maximum of {max_frame_bytes} bytes "
            f"(encoding {message.type})",
        )
    return b"".join((_HEADER.pack(length), bytes((version,)), payload))


class FrameDecoder:
    """Incremental decoder: bytes in, validated messages out.

    Sans-IO (as in h11): it never touches a socket or an event loop. That keeps the
    asyncio transport a thin adapter (read, ``feed``, dispatch) and lets tests drive
    every framing edge case, such as a header split across reads, with plain bytes.

    Any error is fatal for the decoder. After a framing error the byte stream is out
    of sync and nothing that follows can be trusted; after a validation error it
    would be in sync, but the peer is evidently running incompatible code, and
    closing is simpler to reason about than a half-working session.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < _MIN_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be >= {_MIN_FRAME_BYTES}")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._failure: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held back; lets a transport notice a peer
        that sent a partial frame and went quiet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Message]:
        """Append ``data`` and return every message now complete, in order.

        Frames are consumed by advancing an offset and the buffer is trimmed once
        per call, so a burst of small frames costs linear, not quadratic, copying.
        """
        if self._failure is not None:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME, "decoder is closed after an earlier error"
            ) from self._failure
        buffer = self._buffer
        buffer += data
        messages: list[Message] = []
        pos = 0
        try:
            with memoryview(buffer) as view:
                while True:
                    available = len(buffer) - pos
                    if available < _HEADER.size:
                        break
                    (length,) = _HEADER.unpack_from(buffer, pos)
                    self._check_length(length)
                    if available < _HEADER.size + 1:
                        break
                    version = buffer[pos + _HEADER.size]
                    if version != PROTOCOL_VERSION:
                        raise ProtocolError(
                            ErrorCode.UNSUPPORTED_VERSION,
                            f"unsupported protocol version {version} "
                            f"(this coordinator speaks {PROTOCOL_VERSION})",
                        )
                    end = pos + _HEADER.size + length
                    if len(buffer) < end:
                        break
                    # Released explicitly: a traceback holding the slice would
                    # otherwise pin the buffer and make the resize below fail.
                    with view[pos + _HEADER.size + 1 : end] as payload:
                        messages.append(_decode_payload(payload))
                    pos = end
        except ProtocolError as exc:
            exc.decoded = tuple(messages)
            self._failure = exc
            buffer.clear()  # nothing here will ever be read; free it now
            raise
        del buffer[:pos]
        return messages

    def _check_length(self, length: int) -> None:
        if length < _MIN_FRAME_BYTES:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME,
                f"frame length {length} is too short (minimum {_MIN_FRAME_BYTES}: "
                "a version byte and a JSON payload)",
            )
        if length > self._max_frame_bytes:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame of {length} bytes exceeds the maximum of {self._max_frame_bytes} bytes",
            )


def _decode_payload(payload: memoryview) -> Message:
    try:
        text = str(payload, "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"frame payload is not valid UTF-8 ({exc.reason} at byte {exc.start})",
        ) from None
    try:
        return _MESSAGE_ADAPTER.validate_json(text, strict=True)
    except ValidationError as exc:
        raise _validation_failure(exc, text) from None


def _validation_failure(exc: ValidationError, text: str) -> ProtocolError:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first["msg"])
        return ProtocolError(
            ErrorCode.MALFORMED_FRAME, f"frame payload is not valid JSON: {detail}"
        )

    # The JSON is well formed; parse it loosely to recover what we can for the reply.
    try:
        document: Any = from_json(text)
    except ValueError:
        document = None
    correlation_id = 0
    if isinstance(document, dict):
        cid = document.get("correlation_id")
        if type(cid) is int and 0 <= cid < 2**31:
            correlation_id = cid

    if first["loc"] == () and first["type"] in ("dict_type", "model_type"):
        kind = _JSON_KINDS.get(type(document), "null")
        message = f"message must be a JSON object, got {kind}"
    elif first["type"] == "union_tag_not_found":
        message = 'message has no "type" field'
    elif first["type"] == "union_tag_invalid":
        tag = document.get("type") if isinstance(document, dict) else None
        message = f"unknown message type {_short_repr(tag)}"
    else:
        tag = first["loc"][0] if first["loc"] else "?"
        details = [_describe(error) for error in errors[:_MAX_REPORTED_ERRORS]]
        if len(errors) > _MAX_REPORTED_ERRORS:
            details.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more errors")
        message = f"invalid {tag} message: " + "; ".join(details)
    if len(message) > _MAX_ERROR_MESSAGE:
        message = message[: _MAX_ERROR_MESSAGE - 3] + "..."
    return ProtocolError(ErrorCode.INVALID_MESSAGE, message, correlation_id=correlation_id)


def _describe(error: ErrorDetails) -> str:
    """``ranges[0]: slot range [5, 3]: start > end`` -- the path is what a developer
    needs to find the bug; pydantic's default text buries it on a separate line."""
    path = ""
    for part in error["loc"][1:]:  # loc[0] is the union tag, already in the prefix
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":
            path += " key"
        elif part.isidentifier() and len(part) <= _MAX_LOC_PART:
            path += f".{part}" if path else part
        else:
            path += f"[{_short_repr(part)}]"
    msg = str(error["msg"])
    if error["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
    return f"{path or '<message>'}: {msg}"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_LOC_PART else text[: _MAX_LOC_PART - 3] + "..."
