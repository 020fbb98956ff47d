"""Tests for the sans-IO wire codec in keyshard.core.protocol.

Everything here is pure: frames are built by hand or with encode() and fed to a
FrameDecoder, so no sockets or event loop are involved.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from keyshard.core.protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode,
)
from keyshard.core.protocol.messages import (
    MAX_INT32,
    MAX_OFFSET,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    ErrorCode,
    ErrorResponse,
    FetchedWindow,
    LeaveRequest,
    LeaveResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    PartitionPositions,
    PingRequest,
    PingResponse,
    PositionModel,
    RangePosition,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
    is_response,
)

FAST = settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- strategies

NAME_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

names = st.text(alphabet=NAME_ALPHABET, min_size=1, max_size=40)
free_text = st.text(max_size=30)  # any unicode (hypothesis excludes lone surrogates)
# A name a client chooses and the coordinator logs: no control character, no line break.
one_line = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40
)
correlation_ids = st.integers(0, 2**31 - 1)
epochs = st.integers(0, MAX_INT32)  # Kafka's int32 epochs
counts = st.integers(0, MAX_INT32)
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def slot_ranges(draw: st.DrawFn) -> tuple[int, int]:
    start = draw(st.integers(0, 65535))
    end = draw(st.integers(start, 65535))
    return (start, end)


@st.composite
def positions(draw: st.DrawFn) -> PositionModel:
    next_offset = draw(st.integers(0, 2**48))
    acked: list[tuple[int, int]] = []
    cursor = next_offset + 1  # acked intervals start strictly above next_offset
    for gap, length in draw(
        st.lists(st.tuples(st.integers(0, 50), st.integers(1, 50)), max_size=6)
    ):
        start = cursor + gap  # gap 0 makes adjacent intervals, which are still disjoint
        acked.append((start, start + length))
        cursor = start + length
    return PositionModel(next_offset=next_offset, acked=acked)


@st.composite
def fetched_windows(draw: st.DrawFn) -> FetchedWindow:
    start = draw(st.integers(0, 2**48))
    return FetchedWindow(
        topic=draw(st.text(min_size=1, max_size=40)),
        partition=draw(st.integers(0, 10_000)),
        start=start,
        end=draw(st.integers(start, start + 2**20)),
        buckets=draw(st.dictionaries(st.integers(0, 4095), counts, max_size=8)),
    )


range_positions = st.builds(RangePosition, range=slot_ranges(), position=positions())
partition_positions = st.builds(
    PartitionPositions,
    topic=st.text(min_size=1, max_size=40),
    partition=st.integers(0, 10_000),
    ranges=st.lists(range_positions, max_size=4),
)
position_lists = st.lists(partition_positions, max_size=3)
range_lists = st.lists(slot_ranges(), min_size=1, max_size=6)
host_ports = st.builds(
    "{}:{}".format,
    st.sampled_from(["localhost", "10.0.0.7", "[::1]", "coord-1.example.com"]),
    st.integers(1, 65535),
)

MESSAGE_STRATEGIES: dict[type[BaseModel], st.SearchStrategy[Any]] = {
    MetadataRequest: st.builds(MetadataRequest, correlation_id=correlation_ids),
    MetadataResponse: st.builds(
        MetadataResponse,
        correlation_id=correlation_ids,
        coordinator_id=free_text,
        coordinator=host_ports,
        active=st.booleans(),
    ),
    RegisterRequest: st.builds(
        RegisterRequest,
        correlation_id=correlation_ids,
        group=names,
        topics=st.lists(names, min_size=1, max_size=5, unique=True),
        consumer_id=st.none() | free_text,
        consumer_name=one_line,
        session_timeout_ms=st.integers(1000, 300_000),
        capacity=st.integers(1, 100_000),
        fixed_ranges=st.none() | st.lists(slot_ranges(), max_size=5),
        auth_token=st.none() | st.text(max_size=100),
    ),
    RegisterResponse: st.builds(
        RegisterResponse,
        correlation_id=correlation_ids,
        member_id=free_text,
        member_epoch=epochs,
        ping_interval_ms=int64,
        session_timeout_ms=int64,
    ),
    PingRequest: st.builds(PingRequest, correlation_id=correlation_ids, member_epoch=epochs),
    PingResponse: st.builds(
        PingResponse,
        correlation_id=correlation_ids,
        member_epoch=epochs,
        positions=position_lists,
        load=st.dictionaries(st.integers(0, 4095), counts, max_size=8),
        fetched=st.lists(fetched_windows(), max_size=3),
        busy_records=counts,
        busy_ms=st.none() | counts,
    ),
    StopFetcherRequest: st.builds(
        StopFetcherRequest, correlation_id=correlation_ids, member_epoch=epochs, ranges=range_lists
    ),
    StopFetcherResponse: st.builds(
        StopFetcherResponse,
        correlation_id=correlation_ids,
        member_epoch=epochs,
        positions=position_lists,
    ),
    StartFetcherRequest: st.builds(
        StartFetcherRequest,
        correlation_id=correlation_ids,
        member_epoch=epochs,
        ranges=range_lists,
        positions=position_lists,
    ),
    StartFetcherResponse: st.builds(
        StartFetcherResponse, correlation_id=correlation_ids, member_epoch=epochs
    ),
    LeaveRequest: st.builds(
        LeaveRequest,
        correlation_id=correlation_ids,
        member_id=one_line,
        member_epoch=epochs,
        positions=position_lists,
    ),
    LeaveResponse: st.builds(LeaveResponse, correlation_id=correlation_ids),
    ErrorResponse: st.builds(
        ErrorResponse,
        correlation_id=correlation_ids,
        code=st.sampled_from(ErrorCode),
        message=free_text,
    ),
}

messages: st.SearchStrategy[Message] = st.one_of(*MESSAGE_STRATEGIES.values())

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


# --------------------------------------------------------------------------- helpers


def frame(payload: bytes, *, version: int = PROTOCOL_VERSION, length: int | None = None) -> bytes:
    """Hand-built frame, so tests can produce things encode() refuses to."""
    if length is None:
        length = len(payload) + 1
    return struct.pack(">I", length) + bytes([version]) + payload


def json_frame(obj: Any) -> bytes:
    return frame(json.dumps(obj).encode())


def decode_error(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder(max_frame_bytes).feed(data)
    return info.value


def feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[Message]:
    out: list[Message] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


VALID_REGISTER: dict[str, Any] = {
    "type": "register_request",
    "correlation_id": 42,
    "group": "orders-group",
    "topics": ["orders"],
    "consumer_name": "worker-1",
    "session_timeout_ms": 10_000,
}


# --------------------------------------------------------------------------- round trips


def test_strategies_cover_every_message_type() -> None:
    assert set(MESSAGE_STRATEGIES) == set(REQUEST_TYPES) | set(RESPONSE_TYPES)
    assert not set(REQUEST_TYPES) & set(RESPONSE_TYPES)


@pytest.mark.parametrize("cls", list(MESSAGE_STRATEGIES), ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_round_trip_every_type(cls: type[BaseModel], data: st.DataObject) -> None:
    message = data.draw(MESSAGE_STRATEGIES[cls])
    encoded = encode(message)
    assert FrameDecoder().feed(encoded) == [message]
    assert is_response(message) == (cls in RESPONSE_TYPES)


@FAST
@given(batch=st.lists(messages, min_size=1, max_size=6), data=st.data())
def test_arbitrary_chunking_yields_same_messages(batch: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    decoder = FrameDecoder()
    assert feed_all(decoder, chunks) == batch
    assert decoder.buffered_bytes == 0


def test_byte_at_a_time_and_buffered_bytes() -> None:
    message = PingRequest(correlation_id=7, member_epoch=3)
    encoded = encode(message)
    decoder = FrameDecoder()
    for i, byte in enumerate(encoded[:-1]):
        assert decoder.feed(bytes([byte])) == []
        assert decoder.buffered_bytes == i + 1
    assert decoder.feed(encoded[-1:]) == [message]
    assert decoder.buffered_bytes == 0


def test_many_frames_in_one_feed_and_trailing_partial() -> None:
    batch = [PingRequest(correlation_id=i, member_epoch=i) for i in range(500)]
    extra = encode(LeaveResponse(correlation_id=1))
    decoder = FrameDecoder()
    assert decoder.feed(b"".join(encode(m) for m in batch) + extra[:3]) == batch
    assert decoder.buffered_bytes == 3
    assert decoder.feed(extra[3:]) == [LeaveResponse(correlation_id=1)]


def test_wire_shape_is_compact_json_with_inclusive_range_lists() -> None:
    encoded = encode(
        StopFetcherRequest(correlation_id=5, member_epoch=2, ranges=[(0, 10)], coordinator_epoch=3)
    )
    assert encoded[4] == PROTOCOL_VERSION
    assert struct.unpack(">I", encoded[:4])[0] == len(encoded) - 4
    assert json.loads(encoded[5:]) == {
        "correlation_id": 5,
        "type": "stop_fetcher_request",
        "member_epoch": 2,
        "ranges": [[0, 10]],
        "coordinator_epoch": 3,
    }
    assert b" " not in encoded[5:]


def test_ping_response_load_keys_round_trip_as_ints() -> None:
    message = PingResponse(correlation_id=1, member_epoch=1, load={0: 5, 4095: 0})
    (decoded,) = FrameDecoder().feed(encode(message))
    assert isinstance(decoded, PingResponse)
    assert decoded.load == {0: 5, 4095: 0}


# --------------------------------------------------------------------------- fuzzing


def assert_only_protocol_errors(decoder: FrameDecoder, chunks: list[bytes]) -> None:
    for chunk in chunks:
        try:
            result = decoder.feed(chunk)
        except ProtocolError as exc:
            assert isinstance(exc.code, ErrorCode) and exc.message
            with pytest.raises(ProtocolError, match="decoder is closed"):
                decoder.feed(b"")
            return
        assert isinstance(result, list)


@FAST
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(data: bytes) -> None:
    assert_only_protocol_errors(FrameDecoder(), [data])


@FAST
@given(st.lists(st.binary(max_size=50), max_size=10))
def test_arbitrary_chunks_with_small_limit(chunks: list[bytes]) -> None:
    assert_only_protocol_errors(FrameDecoder(max_frame_bytes=64), chunks)


@FAST
@given(st.binary(max_size=2000))
def test_arbitrary_payload_behind_valid_header(payload: bytes) -> None:
    assert_only_protocol_errors(FrameDecoder(), [frame(payload)])


@FAST
@given(JSON_VALUES)
def test_arbitrary_json_behind_valid_header(value: Any) -> None:
    assert_only_protocol_errors(FrameDecoder(), [json_frame(value)])


@FAST
@given(message=messages, key=st.text(max_size=20), value=JSON_VALUES, data=st.data())
def test_mutated_valid_message_fails_only_with_invalid_message(
    message: Message, key: str, value: Any, data: st.DataObject
) -> None:
    document = message.model_dump(mode="json")
    key = data.draw(st.sampled_from([*document, key]))
    if key == "type":
        value = data.draw(st.sampled_from(["ping_request", "leave_response", "nope"]))
    document[key] = value
    try:
        FrameDecoder().feed(json_frame(document))
    except ProtocolError as exc:
        assert exc.code is ErrorCode.INVALID_MESSAGE
        if key != "correlation_id":  # the id survived, so the reply can be routed
            assert exc.correlation_id == message.correlation_id


# --------------------------------------------------------------------------- framing errors


def test_zero_length_frame() -> None:
    exc = decode_error(b"\x00\x00\x00\x00")
    assert exc.code is ErrorCode.MALFORMED_FRAME
    assert "frame length 0 is too short" in exc.message


def test_length_one_frame_has_no_room_for_json() -> None:
    exc = decode_error(b"\x00\x00\x00\x01\x01")
    assert exc.code is ErrorCode.MALFORMED_FRAME
    assert "frame length 1 is too short" in exc.message


def test_oversized_frame_rejected_from_header_alone() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    header = struct.pack(">I", 101)
    assert decoder.feed(header[:3]) == []
    with pytest.raises(ProtocolError) as info:
        decoder.feed(header[3:])  # no version byte, no body: the header is enough
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "frame of 101 bytes exceeds the maximum of 100" in info.value.message
    assert decoder.buffered_bytes == 0


def test_default_limit_rejects_huge_header() -> None:
    exc = decode_error(b"\xff\xff\xff\xff")
    assert exc.code is ErrorCode.FRAME_TOO_LARGE
    assert f"frame of {2**32 - 1} bytes exceeds the maximum of {DEFAULT_MAX_FRAME_BYTES}" in (
        exc.message
    )


def test_frame_exactly_at_limit_is_accepted() -> None:
    message = PingRequest(correlation_id=1, member_epoch=1)
    encoded = encode(message)
    length = len(encoded) - 4
    assert FrameDecoder(max_frame_bytes=length).feed(encoded) == [message]
    assert decode_error(encoded, max_frame_bytes=length - 1).code is ErrorCode.FRAME_TOO_LARGE


def test_wrong_version_rejected_before_body_arrives() -> None:
    encoded = encode(PingRequest(correlation_id=1, member_epoch=1), version=7)
    decoder = FrameDecoder()
    assert decoder.feed(encoded[:4]) == []
    with pytest.raises(ProtocolError) as info:
        decoder.feed(encoded[4:5])
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert info.value.message == "unsupported protocol version 7 (this coordinator speaks 1)"


def test_invalid_utf8() -> None:
    exc = decode_error(frame(b'{"type": "\xff"}'))
    assert exc.code is ErrorCode.MALFORMED_FRAME
    assert "not valid UTF-8" in exc.message


@pytest.mark.parametrize("payload", [b"{", b"not json", b"{}{}", b"[" * 100_000])
def test_invalid_json(payload: bytes) -> None:
    exc = decode_error(frame(payload))
    assert exc.code is ErrorCode.MALFORMED_FRAME
    assert "not valid JSON" in exc.message


def test_decoder_is_closed_after_error() -> None:
    decoder = FrameDecoder()
    good = encode(PingRequest(correlation_id=1, member_epoch=1))
    with pytest.raises(ProtocolError):
        decoder.feed(b"\x00\x00\x00\x00")
    with pytest.raises(ProtocolError) as info:
        decoder.feed(good)
    assert info.value.code is ErrorCode.MALFORMED_FRAME
    assert info.value.message == "decoder is closed after an earlier error"
    assert isinstance(info.value.__cause__, ProtocolError)


def test_error_keeps_messages_decoded_earlier_in_same_feed() -> None:
    first = LeaveRequest(correlation_id=1, member_id="m", member_epoch=3, positions=[])
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(encode(first) + json_frame({"type": "nope", "correlation_id": 2}))
    assert info.value.decoded == (first,)
    assert info.value.correlation_id == 2


def test_max_frame_bytes_must_fit_a_frame() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=1)


# --------------------------------------------------------------------------- message errors


def test_unknown_type() -> None:
    exc = decode_error(json_frame({"type": "steal_partition", "correlation_id": 9}))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert "unknown message type 'steal_partition'" in exc.message
    assert exc.correlation_id == 9


def test_missing_type_and_non_object() -> None:
    exc = decode_error(json_frame({"correlation_id": 9}))
    assert (exc.code, exc.message) == (ErrorCode.INVALID_MESSAGE, 'message has no "type" field')
    exc = decode_error(json_frame([1, 2]))
    assert "must be a JSON object, got array" in exc.message


def test_register_with_empty_topics() -> None:
    exc = decode_error(json_frame({**VALID_REGISTER, "topics": []}))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert "invalid register_request message" in exc.message
    assert "give either topics (at least one) or topic_pattern" in exc.message
    assert exc.correlation_id == 42
    reply = exc.to_response()
    assert (reply.correlation_id, reply.code) == (42, ErrorCode.INVALID_MESSAGE)
    assert exc.to_response(correlation_id=5).correlation_id == 5


@pytest.mark.parametrize(
    ("topics", "reason"),
    [
        (["orders", "orders"], "duplicate topics: 'orders'"),
        (["bad topic"], "topics[0]: String should match pattern"),
        (["trailing\n"], "topics[0]: String should match pattern"),
        (["x" * 250], "topics[0]: String should have at most 249 characters"),
    ],
)
def test_register_topic_rules(topics: list[str], reason: str) -> None:
    exc = decode_error(json_frame({**VALID_REGISTER, "topics": topics}))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert reason in exc.message


@pytest.mark.parametrize(
    "name", ["c0\n2026-01-01 WARNING forged", "tab\there", "esc\x1b[2J", "nel\x85", "ls\u2028"]
)
def test_a_consumer_name_that_would_break_a_log_line_is_refused(name: str) -> None:
    exc = decode_error(json_frame({**VALID_REGISTER, "consumer_name": name}))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert "consumer_name: a name must not contain control characters or line breaks" in exc.message
    leave = {"type": "leave_request", "correlation_id": 1, "member_id": name,
             "member_epoch": 1, "positions": []}  # fmt: skip
    assert "member_id: a name must not" in decode_error(json_frame(leave)).message
    (ok,) = FrameDecoder().feed(json_frame({**VALID_REGISTER, "consumer_name": "wörker 1 ✓"}))
    assert isinstance(ok, RegisterRequest)


def test_decoder_limit_and_screen_change_between_frames() -> None:
    """A coordinator holds a connection to a small limit, screening each frame before it
    is validated, until the connection registers; then the normal limit, unscreened."""
    seen: list[Any] = []

    def screen(document: Any) -> None:
        seen.append(document)
        if isinstance(document, dict) and document.get("auth_token") != "t":
            raise ProtocolError(ErrorCode.AUTHENTICATION_FAILED, "no")

    decoder = FrameDecoder(100_000, screen=screen)
    (first,) = decoder.feed(json_frame({**VALID_REGISTER, "auth_token": "t"}))
    assert isinstance(first, RegisterRequest) and seen == [{**VALID_REGISTER, "auth_token": "t"}]
    decoder.max_frame_bytes, decoder.screen = 1000, None
    (unscreened,) = decoder.feed(json_frame(VALID_REGISTER))
    assert isinstance(unscreened, RegisterRequest) and len(seen) == 1
    with pytest.raises(ProtocolError) as too_large:
        decoder.feed(json_frame({**VALID_REGISTER, "consumer_name": "x" * 2000}))
    assert too_large.value.code is ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(ProtocolError) as refused:
        FrameDecoder(screen=screen).feed(json_frame({**VALID_REGISTER, "session_timeout_ms": 1}))
    assert refused.value.code is ErrorCode.AUTHENTICATION_FAILED  # before validation


def test_register_valid_fixture_decodes() -> None:
    (message,) = FrameDecoder().feed(json_frame(VALID_REGISTER))
    assert isinstance(message, RegisterRequest)
    assert message.capacity == 1 and message.fixed_ranges is None


@pytest.mark.parametrize(
    ("bad_range", "reason"),
    [
        ([70000, 70001], "ranges[0]: slot range [70000, 70001]: slots must be within 0..65535"),
        ([5, 3], "ranges[0]: slot range [5, 3]: start > end"),
        ([-1, 3], "slot range [-1, 3]"),
        ([1, 2, 3], "ranges[0]: Tuple should have at most 2 items"),
    ],
)
def test_bad_slot_range(bad_range: list[int], reason: str) -> None:
    exc = decode_error(
        json_frame(
            {
                "type": "stop_fetcher_request",
                "correlation_id": 3,
                "member_epoch": 1,
                "ranges": [bad_range],
            }
        )
    )
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert reason in exc.message
    with pytest.raises(ValidationError, match=r"slot range|Tuple"):
        StopFetcherRequest(correlation_id=3, member_epoch=1, ranges=[tuple(bad_range)])  # type: ignore[list-item]


def test_stop_fetcher_needs_ranges() -> None:
    exc = decode_error(
        json_frame(
            {"type": "stop_fetcher_request", "correlation_id": 3, "member_epoch": 1, "ranges": []}
        )
    )
    assert "ranges: List should have at least 1 item" in exc.message


def _ping_with_position(position: dict[str, Any]) -> bytes:
    return json_frame(
        {
            "type": "ping_response",
            "correlation_id": 8,
            "member_epoch": 1,
            "positions": [
                {"topic": "t", "partition": 0, "ranges": [{"range": [0, 9], "position": position}]}
            ],
        }
    )


@pytest.mark.parametrize(
    ("position", "reason"),
    [
        (
            {"next_offset": 10, "acked": [[10, 12]]},
            "positions[0].ranges[0].position.acked: acked interval [10, 12) does not start "
            "above next_offset 10",
        ),
        ({"next_offset": 10, "acked": [[12, 12]]}, "acked interval [12, 12) is empty"),
        ({"next_offset": 0, "acked": [[5, 8], [7, 9]]}, "[5, 8) and [7, 9) overlap or are out"),
        ({"next_offset": 0, "acked": [[7, 9], [2, 3]]}, "[7, 9) and [2, 3) overlap or are out"),
        ({"next_offset": -1}, "position.next_offset: Input should be greater than or equal to 0"),
    ],
)
def test_bad_positions(position: dict[str, Any], reason: str) -> None:
    exc = decode_error(_ping_with_position(position))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert reason in exc.message


@pytest.mark.parametrize(
    ("window", "reason"),
    [
        ({"start": 10, "end": 9}, "fetched window ends (9) before it starts (10)"),
        ({"start": -1, "end": 9}, "fetched[0].start: Input should be greater than or equal to 0"),
        (
            {"start": 0, "end": 9, "buckets": {"4096": 1}},
            "fetched[0].buckets['4096'] key: Input should be less than or equal to 4095",
        ),
        (
            {"start": 0, "end": 9, "buckets": {"7": -1}},
            "fetched[0].buckets['7']: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_fetched_windows(window: dict[str, Any], reason: str) -> None:
    frame = json_frame(
        {
            "type": "ping_response",
            "correlation_id": 8,
            "member_epoch": 1,
            "fetched": [{"topic": "t", "partition": 0, **window}],
        }
    )
    exc = decode_error(frame)
    assert exc.code is ErrorCode.INVALID_MESSAGE
    assert reason in exc.message


def test_busy_time_is_optional_and_never_negative() -> None:
    """A consumer that does not measure its speed sends none; a negative time is
    refused."""
    reply = {"type": "ping_response", "correlation_id": 8, "member_epoch": 1}
    (decoded,) = FrameDecoder(DEFAULT_MAX_FRAME_BYTES).feed(json_frame(reply))
    assert isinstance(decoded, PingResponse) and decoded.busy_ms is None
    assert decoded.busy_records == 0
    for field in ("busy_ms", "busy_records"):
        exc = decode_error(json_frame({**reply, field: -1}))
        assert exc.code is ErrorCode.INVALID_MESSAGE
        assert f"{field}: Input should be greater than or equal to 0" in exc.message


HUGE = 10**400  # a valid JSON integer; as a float it would overflow


@pytest.mark.parametrize(
    ("path", "value", "bound"),
    [
        (("positions", 0, "ranges", 0, "position", "next_offset"), HUGE, MAX_OFFSET),
        (("positions", 0, "ranges", 0, "position", "acked", 0, 1), HUGE, MAX_OFFSET),
        (("positions", 0, "partition"), 2**31, MAX_INT32),
        (("high_watermarks", 0, "offset"), HUGE, MAX_OFFSET),
        (("fetched", 0, "end"), 2**63, MAX_OFFSET),
        (("fetched", 0, "buckets", "7"), HUGE, MAX_INT32),
        (("load", "7"), 10**308, MAX_INT32),
        (("busy_records",), HUGE, MAX_INT32),
        (("busy_ms",), 2**31, MAX_INT32),
        (("member_epoch",), HUGE, MAX_INT32),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else "",
)
def test_every_number_on_the_wire_has_an_upper_bound(
    path: tuple[str | int, ...], value: int, bound: int
) -> None:
    """Kafka's own types (int64 offsets, int32 partitions, epochs and counts): a peer's
    10**400 is an INVALID_MESSAGE naming the field, never a number that overflows a
    float in the coordinator."""
    reply: dict[str, Any] = {
        "type": "ping_response", "correlation_id": 8, "member_epoch": 1,
        "positions": [{"topic": "t", "partition": 0, "ranges": [
            {"range": [0, 9], "position": {"next_offset": 5, "acked": [[7, 9]]}}]}],
        "high_watermarks": [{"topic": "t", "partition": 0, "offset": 9}],
        "fetched": [{"topic": "t", "partition": 0, "start": 0, "end": 9, "buckets": {"7": 3}}],
        "load": {"7": 3}, "busy_records": 3, "busy_ms": 10,
    }  # fmt: skip
    FrameDecoder(DEFAULT_MAX_FRAME_BYTES).feed(json_frame(reply))  # valid as it is
    parent: Any = reply
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    exc = decode_error(json_frame(reply))
    assert exc.code is ErrorCode.INVALID_MESSAGE
    field = "".join(
        f"[{k}]" if isinstance(k, int) else f"['{k}']" if k.isdigit() else f".{k}" for k in path
    ).lstrip(".")
    assert f"{field}: Input should be less than or equal to {bound}" in exc.message


def test_adjacent_acked_intervals_are_disjoint() -> None:
    position = PositionModel(next_offset=1, acked=[(3, 5), (5, 7)])
    assert position.acked == [(3, 5), (5, 7)]


def test_decoding_is_strict_about_json_types() -> None:
    ping = {"type": "ping_request", "correlation_id": 1, "member_epoch": 1}
    for field, value in [("member_epoch", "1"), ("member_epoch", 1.0), ("correlation_id", True)]:
        exc = decode_error(json_frame({**ping, field: value}))
        assert f"{field}: Input should be a valid integer" in exc.message
    exc = decode_error(json_frame({**ping, "extra": 1}))
    assert "extra: Extra inputs are not permitted" in exc.message


def test_error_message_stays_bounded_for_hostile_input() -> None:
    document = {"type": "ping_request", "correlation_id": 1, "member_epoch": 1}
    document.update({"k" * 5000 + str(i): i for i in range(20)})
    exc = decode_error(json_frame(document))
    assert len(exc.message) <= 1000
    assert "and 15 more errors" in exc.message


def test_correlation_id_out_of_range_is_not_echoed() -> None:
    exc = decode_error(
        json_frame({"type": "ping_request", "correlation_id": 2**31, "member_epoch": 1})
    )
    assert exc.correlation_id == 0
    assert "correlation_id: Input should be less than" in exc.message


def test_metadata_response_address_must_be_host_port() -> None:
    with pytest.raises(ValidationError, match="is not host:port"):
        MetadataResponse(correlation_id=1, coordinator_id="c", coordinator="nohost", active=True)
    with pytest.raises(ValidationError, match="is not host:port"):
        MetadataResponse(correlation_id=1, coordinator_id="c", coordinator="h:99999", active=True)


# --------------------------------------------------------------------------- encode / misc


def test_encode_rejects_message_over_limit() -> None:
    message = ErrorResponse(correlation_id=1, code=ErrorCode.INTERNAL, message="x" * 2000)
    with pytest.raises(ProtocolError) as info:
        encode(message, max_frame_bytes=1000)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "exceeds the maximum of 1000 bytes" in info.value.message
    length = len(encode(message)) - 4
    assert encode(message, max_frame_bytes=length)
    with pytest.raises(ProtocolError):
        encode(message, max_frame_bytes=length - 1)


def test_encode_default_limit() -> None:
    big = ErrorResponse(
        correlation_id=1, code=ErrorCode.INTERNAL, message="x" * DEFAULT_MAX_FRAME_BYTES
    )
    with pytest.raises(ProtocolError) as info:
        encode(big)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_encode_unencodable_string_is_a_protocol_error() -> None:
    message = ErrorResponse(correlation_id=1, code=ErrorCode.INTERNAL, message="\ud800")
    with pytest.raises(ProtocolError) as info:
        encode(message)
    assert info.value.code is ErrorCode.INVALID_MESSAGE


def test_encode_rejects_version_outside_a_byte() -> None:
    with pytest.raises(ValueError):
        encode(LeaveResponse(correlation_id=1), version=256)


def test_messages_are_frozen_and_hide_auth_token() -> None:
    message = RegisterRequest(**{**VALID_REGISTER, "auth_token": "s3cret"})
    assert "s3cret" not in repr(message)
    with pytest.raises(ValidationError):
        message.capacity = 2


def test_protocol_error_to_response_defaults() -> None:
    reply = ProtocolError(ErrorCode.NOT_COORDINATOR, "go away").to_response()
    assert reply == ErrorResponse(
        correlation_id=0, code=ErrorCode.NOT_COORDINATOR, message="go away"
    )
    assert is_response(reply)
    assert not is_response(MetadataRequest(correlation_id=0))
