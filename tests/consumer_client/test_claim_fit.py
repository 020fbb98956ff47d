"""A claim too large for what a coordinator takes before authentication is sent with less
in it (docs/protocol.md §3.3): first without the offsets acked out of order, then without
positions; never refused for its size, and never saying more than the member did."""

from __future__ import annotations

from keyshard.consumer_client._membership.claim_fit import fit_before_authentication
from keyshard.consumer_client._membership.state import MemberStateMachine
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.codec import PRE_AUTH_MAX_FRAME_BYTES, encode
from keyshard.core.protocol.messages import (
    MemberClaim,
    PartitionPositions,
    PositionModel,
    RangePosition,
    RegisterRequest,
    RegisterResponse,
)
from keyshard.core.protocol.wire import positions_from_wire


def _claim(partitions: int, acked_per_range: int) -> MemberClaim:
    acked = [(2 * i + 11, 2 * i + 12) for i in range(acked_per_range)]
    position = PositionModel(next_offset=10, acked=acked)
    ranges = [RangePosition(range=(0, 65535), position=position)]
    positions = [
        PartitionPositions(topic="t", partition=p, ranges=ranges) for p in range(partitions)
    ]
    return MemberClaim(
        member_id="m-1", member_epoch=3, owned=[(0, 65535)], positions=positions,
        coordinator_epoch=2,
    )  # fmt: skip


def _register(claim: MemberClaim | None) -> RegisterRequest:
    return RegisterRequest(
        correlation_id=0, group="g", topics=["t"], consumer_name="c", session_timeout_ms=10_000,
        claim=claim,
    )  # fmt: skip


def _size(request: RegisterRequest) -> int:
    return len(encode(request)) - 4


def test_a_register_that_fits_is_sent_as_it_is() -> None:
    for request in (_register(None), _register(_claim(10, 20))):
        assert _size(request) <= PRE_AUTH_MAX_FRAME_BYTES
        assert fit_before_authentication(request) is request


def test_a_large_claim_goes_without_its_acked_offsets_then_without_positions() -> None:
    acked_heavy = _register(_claim(20, 400))
    assert _size(acked_heavy) > PRE_AUTH_MAX_FRAME_BYTES
    thinner = fit_before_authentication(acked_heavy)
    assert _size(thinner) <= PRE_AUTH_MAX_FRAME_BYTES
    assert thinner.claim is not None and acked_heavy.claim is not None
    assert thinner.claim.owned == acked_heavy.claim.owned
    assert [(p.topic, p.partition) for p in thinner.claim.positions] == [
        ("t", p) for p in range(20)
    ]
    for partition in thinner.claim.positions:  # less said, nothing false
        assert [r.position for r in partition.ranges] == [PositionModel(next_offset=10)]

    partition_heavy = _register(_claim(3000, 0))  # too many partitions even bare
    assert _size(partition_heavy) > PRE_AUTH_MAX_FRAME_BYTES
    bare = fit_before_authentication(partition_heavy)
    assert bare.claim is not None and bare.claim.positions == []
    assert bare.claim.member_id == "m-1" and _size(bare) <= PRE_AUTH_MAX_FRAME_BYTES


def test_the_member_registers_with_the_claim_it_sent() -> None:
    """The state machine sends the fitted claim and settles against it."""
    m = MemberStateMachine[str](
        group="g", topics=["t"], name="c", session_timeout_ms=10_000, capacity=1
    )
    m.begin_discovery(0.0)
    m.begin_registration()
    m.register_request(0.0)
    first = RegisterResponse(
        correlation_id=0, member_id="m-1", member_epoch=1, ping_interval_ms=3000,
        session_timeout_ms=10_000, coordinator_epoch=1,
    )  # fmt: skip
    m.settle(first)
    m.registered(first, "a", "a:1", 0.0)
    m.disconnected("peer closed the connection", None, 1.0)
    m.begin_registration()
    held = {
        ("t", p): [
            (SlotRange(0, 65535), Position(10, tuple((o, o + 1) for o in range(11, 2000, 2))))
        ]
        for p in range(20)
    }
    request = m.register_request(1.0, (RangeSet.full(), held))
    assert request.claim is not None and _size(request) <= PRE_AUTH_MAX_FRAME_BYTES
    sent = positions_from_wire(request.claim.positions)
    assert sent == {("t", p): [(SlotRange(0, 65535), Position(10))] for p in range(20)}
