"""Sans-IO frame codec of the coordinator <-> consumer protocol: bytes in, messages out.

Wire format (every message, both directions)::

    +----------------------+-----------+------------------------------+
    | length L: uint32, BE | version:1 | JSON object (UTF-8), L-1 B   |
    +----------------------+-----------+------------------------------+

* ``L`` counts the bytes after the length field (version byte + JSON), so a
  reader knows how much to wait for without scanning. ``2 <= L <= max_frame_bytes``
  (default :data:`DEFAULT_MAX_FRAME_BYTES`, 1 MiB); the check runs as soon as the
  4 header bytes arrive, so a hostile or buggy peer cannot make us buffer a huge body.
  Until its Register succeeds a connection is held to a smaller limit (default
  :data:`PRE_AUTH_MAX_FRAME_BYTES`, 64 KiB), and a client keeps its Register within it.
* ``version`` is :data:`PROTOCOL_VERSION`. It is per frame rather than negotiated
  once so a future version can be rolled out without a handshake message.
* The JSON object is one of `keyshard.core.protocol.messages`.

JSON rather than a binary schema: the messages are small and infrequent (control
plane only; records never cross this socket), and being able to read a frame in a
packet capture is worth more than the bytes saved.
"""

import enum
import struct
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticSerializationError, from_json

from keyshard.core.protocol.messages import ErrorCode, ErrorResponse, Message

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 1 << 20
#: The largest frame a coordinator takes by default from a connection that has not
#: registered yet, and the largest a client sends then: a Register fits (the reference
#: client trims what a claim carries to fit), and an unauthenticated peer cannot make the
#: coordinator hold or validate more (docs/protocol.md §3.3).
PRE_AUTH_MAX_FRAME_BYTES = 1 << 16

_HEADER = struct.Struct(">I")
_MIN_FRAME_BYTES = 2  # version byte + at least one byte of JSON
_MAX_REPORTED_ERRORS = 5
_MAX_LOC_PART = 64  # dict keys / extra field names in error paths come from the peer
_MAX_ERROR_MESSAGE = 1000
_JSON_KINDS = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
# Built once: constructing the validator for a 13-way union is the expensive part.
_MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)

Screen = Callable[[Any], None]
"""Looks at a frame's parsed JSON (None when it is not JSON) before it is validated, and
raises a `ProtocolError` to refuse it: validating a large message costs far more than
parsing it, so a coordinator checks what it can cheaply (a Register's token) first."""


# --------------------------------------------------------------------------- foreign peers


class ForeignProtocol(enum.Enum):
    """What a peer that does not speak this protocol speaks instead, told by its first
    bytes. Read as a frame, each is an absurd length: b"HTTP" is 1213486160 bytes."""

    TLS = "a TLS handshake: the peer uses TLS, this end does not"
    HTTP_REQUEST = "an HTTP request: the peer is an HTTP client"
    HTTP_RESPONSE = "an HTTP response: the peer is an HTTP server"


_TLS_HANDSHAKE = 0x16  # the content type of a TLS handshake record
_HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ")


def foreign_protocol(first: bytes) -> ForeignProtocol | None:
    """The protocol a peer's first bytes are in, when not this one and recognizable."""
    if first[:1] == bytes((_TLS_HANDSHAKE,)):
        return ForeignProtocol.TLS
    if first.startswith(b"HTTP/"):
        return ForeignProtocol.HTTP_RESPONSE
    if first.startswith(_HTTP_METHODS):
        return ForeignProtocol.HTTP_REQUEST
    return None


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

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *, screen: Screen | None = None
    ) -> None:
        self._max_frame_bytes = _checked_limit(max_frame_bytes)
        self._buffer = bytearray()
        self._failure: ProtocolError | None = None
        self.screen = screen

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        """Frames from now on, the one partly received included, may be this long: a
        coordinator takes larger frames from a connection once it has authenticated."""
        self._max_frame_bytes = _checked_limit(value)

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
                        messages.append(_decode_payload(payload, self.screen))
                    pos = end
        except ProtocolError as exc:
            exc.decoded = tuple(messages)
            # A copy without the traceback: the error's traceback holds this frame, whose
            # `data` (up to a whole read) would otherwise live on in a reference cycle
            # until the garbage collector's next full pass, for every peer that erred.
            self._failure = ProtocolError(exc.code, exc.message, correlation_id=exc.correlation_id)
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


def _checked_limit(max_frame_bytes: int) -> int:
    if max_frame_bytes < _MIN_FRAME_BYTES:
        raise ValueError(f"max_frame_bytes must be >= {_MIN_FRAME_BYTES}")
    return max_frame_bytes


def _decode_payload(payload: memoryview, screen: Screen | None) -> Message:
    try:
        text = str(payload, "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"frame payload is not valid UTF-8 ({exc.reason} at byte {exc.start})",
        ) from None
    if screen is not None:
        try:
            document: Any = from_json(text)
        except ValueError:
            document = None  # validation says what is wrong with it, at no cost
        screen(document)
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
    correlation_id = correlation_id_of(document)

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


def correlation_id_of(document: Any) -> int:
    """The request id of a parsed but unvalidated frame, for the error that answers it:
    its `correlation_id` when that is a valid one, else 0."""
    cid = document.get("correlation_id") if isinstance(document, dict) else None
    return cid if type(cid) is int and 0 <= cid < 2**31 else 0


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
