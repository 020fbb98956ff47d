"""The member's state machine (docs/protocol.md §6.1, §7) as plain functions: no socket,
no event loop, time passed in. The connector that carries its decisions out is covered by
the integration tests (failover, riding through, claims, fencing)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshard.consumer_client._membership.member_hooks import Fetched, PingReport
from keyshard.consumer_client._membership.state import (
    FIRST_RETRY_S,
    LAST_RETRY_S,
    MIN_RETRY_S,
    PROBE_INTERVAL_S,
    Adopted,
    Apply,
    Expired,
    Fresh,
    Hold,
    Ignore,
    Lose,
    MemberState,
    MemberStateMachine,
    Probe,
    Refuse,
    RideThrough,
    Unexpected,
    Wait,
    ping_response,
)
from keyshard.core.model.positions import Position, PositionUpdate
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import (
    ErrorCode,
    LeaveRequest,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    RegisterResponse,
    StartFetcherRequest,
    StopFetcherRequest,
)
from keyshard.core.protocol.wire import positions_from_wire, ranges_from_wire

SESSION_MS = 10_000
TP = ("t", 0)
LOW, HIGH = SlotRange(0, 99), SlotRange(100, 199)


class Chan:
    """A channel as the machine sees one: something to tell apart from another."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def state(m: MemberStateMachine[Chan]) -> MemberState:
    """Read afresh: mypy would otherwise keep an earlier assert's narrowing."""
    return m.state


def member_id(m: MemberStateMachine[Chan]) -> str | None:
    return m.member_id


def machine() -> MemberStateMachine[Chan]:
    return MemberStateMachine[Chan](
        group="g", topics=["t"], name="c", session_timeout_ms=SESSION_MS, capacity=2,
        auth_token="tok",
    )  # fmt: skip


def response(
    member_id: str = "m-1",
    epoch: int = 1,
    coordinator_epoch: int = 3,
    adopted: list[tuple[int, int]] | None = None,
) -> RegisterResponse:
    return RegisterResponse(
        correlation_id=1, member_id=member_id, member_epoch=epoch, ping_interval_ms=3333,
        session_timeout_ms=SESSION_MS, coordinator_epoch=coordinator_epoch,
        adopted=adopted or [],
    )  # fmt: skip


def ping(member_epoch: int = 1, coordinator_epoch: int = 3) -> PingRequest:
    return PingRequest(
        correlation_id=7, member_epoch=member_epoch, coordinator_epoch=coordinator_epoch
    )


def positions(offset: int, *ranges: SlotRange) -> PositionUpdate:
    return {TP: [(r, Position(offset)) for r in ranges]}


def registered(now: float = 100.0, channel: Chan | None = None) -> MemberStateMachine[Chan]:
    """A member registered at `now` on `channel`, served by coordinator a:1."""
    m = machine()
    assert m.begin_discovery(now) is None
    m.begin_registration()
    m.register_request(now)
    assert m.settle(response()) == Fresh()
    assert m.registered(response(), channel or Chan("first"), "a:1", now) == []
    return m


def test_a_new_member_registers_without_a_claim_and_its_lease_starts_at_the_send() -> None:
    m = machine()
    assert state(m) is MemberState.DISCOVER and not m.claims
    assert m.heard_ago(50.0) is None
    assert m.begin_discovery(50.0) is None  # a new member's attempt has no lease to keep
    m.begin_registration()
    assert state(m) is MemberState.REGISTER
    request = m.register_request(50.0)
    assert request.claim is None
    assert (request.group, request.topics, request.consumer_name) == ("g", ["t"], "c")
    assert (request.session_timeout_ms, request.capacity, request.auth_token) == (
        SESSION_MS, 2, "tok",
    )  # fmt: skip
    assert m.heard_ago(53.0) == 3.0  # the clock runs from the send
    assert m.settle(response()) == Fresh()
    channel = Chan("c1")
    assert m.registered(response(), channel, "a:1", 55.0) == []
    assert state(m) is MemberState.MEMBER
    assert (member_id(m), m.epoch, m.coordinator_epoch, m.session) == ("m-1", 1, 3, 1)
    assert m.channel is channel and m.heard_ago(55.0) == 0.0


def test_the_registration_keeps_its_credentials_out_of_its_repr() -> None:
    m = MemberStateMachine[Chan](
        group="g", topics=["t"], name="c", session_timeout_ms=SESSION_MS, capacity=2,
        auth_token="Zq9-secret",
    )  # fmt: skip
    assert m.registration.auth_token == "Zq9-secret"
    assert "Zq9" not in repr(m.registration) and "name='c'" in repr(m.registration)


def test_requests_that_arrive_while_a_registration_settles_are_held_in_order() -> None:
    m = machine()
    m.begin_discovery(0.0)
    m.begin_registration()
    m.register_request(0.0)
    channel, old = Chan("new"), Chan("old")
    start = StartFetcherRequest(
        correlation_id=2, member_epoch=1, ranges=[(0, 99)], positions=[], coordinator_epoch=3
    )
    assert m.on_request(channel, ping(), 1.0) == Hold()
    assert m.on_request(old, ping(), 1.0) == Hold()  # held too; ignored when applied
    assert m.on_request(channel, start, 1.5) == Hold()
    held = m.registered(response(), channel, "a:1", 2.0)
    assert held == [(channel, ping()), (old, ping()), (channel, start)]
    assert m.on_request(old, ping(), 2.5) == Ignore()
    assert m.on_request(channel, start, 2.5) == Apply()


def test_a_failed_registration_holds_nothing_and_goes_back_to_looking() -> None:
    m = machine()
    m.begin_discovery(0.0)
    m.begin_registration()
    m.abandon_registration()
    assert state(m) is MemberState.DISCOVER
    assert m.on_request(Chan("x"), ping(), 1.0) == Ignore()  # not holding any more


def test_a_valid_request_renews_the_lease_and_raises_the_epochs() -> None:
    channel = Chan("c")
    m = registered(now=100.0, channel=channel)
    assert m.on_request(channel, ping(member_epoch=4, coordinator_epoch=5), 103.0) == Apply()
    assert (m.epoch, m.coordinator_epoch, m.heard_ago(103.0)) == (4, 5, 0.0)
    assert m.on_request(channel, ping(member_epoch=2, coordinator_epoch=5), 104.0) == Apply()
    assert m.epoch == 4  # an older member epoch in a request never lowers it
    stop = StopFetcherRequest(
        correlation_id=3, member_epoch=6, ranges=[(0, 9)], coordinator_epoch=5
    )
    assert m.on_request(channel, stop, 105.0) == Apply()
    assert m.epoch == 6 and m.heard_ago(105.0) == 0.0


def test_a_request_of_an_older_coordinator_epoch_is_refused_and_renews_nothing() -> None:
    channel = Chan("c")
    m = registered(now=100.0, channel=channel)  # coordinator epoch 3
    decision = m.on_request(channel, ping(member_epoch=9, coordinator_epoch=2), 104.0)
    assert isinstance(decision, Refuse)
    assert decision.error.code is ErrorCode.STALE_COORDINATOR
    assert decision.error.message == "coordinator epoch 2 is older than 3"
    assert (m.epoch, m.coordinator_epoch, m.heard_ago(104.0)) == (1, 3, 4.0)


def test_a_message_no_coordinator_sends_is_unexpected_and_renews_nothing() -> None:
    channel = Chan("c")
    m = registered(now=100.0, channel=channel)
    decision = m.on_request(channel, MetadataRequest(correlation_id=4, group="g"), 102.0)
    assert decision == Unexpected("a coordinator may not send metadata_request")
    assert m.heard_ago(102.0) == 2.0


def test_silence_is_waited_on_then_probed_then_the_lease_expires() -> None:
    channel = Chan("c")
    m = registered(now=100.0, channel=channel)
    assert m.watch(101.0) == Wait(4.0)  # until half the session
    assert state(m) is MemberState.MEMBER
    assert m.watch(105.0) == Probe(within_s=5.0, then_wait_s=PROBE_INTERVAL_S)
    assert state(m) is MemberState.SUSPECT
    probe = m.watch(109.8)
    assert isinstance(probe, Probe) and probe.within_s == pytest.approx(0.2)
    assert probe.then_wait_s == pytest.approx(0.2)  # never past the lease
    assert m.on_request(channel, ping(), 109.9) == Apply()  # it spoke after all
    assert state(m) is MemberState.MEMBER
    assert m.watch(109.9) == Wait(5.0)
    assert m.watch(119.9) == Expired()


def test_a_probe_answer_tells_whether_the_group_moved() -> None:
    m = registered()  # served by a:1 at coordinator epoch 3

    def answer(coordinator: str, epoch: int, active: bool = True) -> MetadataResponse:
        return MetadataResponse(
            correlation_id=1, coordinator=coordinator, coordinator_id=coordinator, active=active,
            coordinator_epoch=epoch,
        )  # fmt: skip

    assert m.moved(answer("b:2", 4, active=False)) is None  # a takeover under way: ask on
    assert m.moved(answer("a:1", 3)) is False
    assert m.moved(answer("b:2", 3)) is True
    assert m.moved(answer("a:1", 4)) is True  # the same address, a newer replica
    assert m.probe_order([("a", 1), ("b", 2), ("c", 3)]) == [("b", 2), ("c", 3), ("a", 1)]


def test_a_fence_ends_the_session_at_once() -> None:
    m = registered(now=100.0)
    loss = m.disconnected("peer error FENCED_MEMBER: x", ErrorCode.FENCED_MEMBER, 101.0)
    assert loss == Lose("peer error FENCED_MEMBER: x", fenced=True)
    assert state(m) is MemberState.LOST and member_id(m) is None and not m.claims
    assert m.begin_discovery(101.0) is None and state(m) is MemberState.DISCOVER


@pytest.mark.parametrize("code", [None, ErrorCode.NOT_COORDINATOR, ErrorCode.INTERNAL])
def test_any_other_close_is_ridden_through_while_the_lease_lasts(code: ErrorCode | None) -> None:
    m = registered(now=100.0)
    ride = m.disconnected("peer closed the connection", code, 103.0)
    assert ride == RideThrough("peer closed the connection", 7.0)
    assert state(m) is MemberState.RIDING and member_id(m) == "m-1" and m.claims
    assert m.channel is None
    assert m.lease_ran_out(109.0) is None
    assert m.begin_discovery(109.0) == pytest.approx(1.0)  # the attempt is bounded by it
    assert m.lease_ran_out(110.0) == Lose("the lease ran out before a coordinator took the claim")
    assert member_id(m) is None and state(m) is MemberState.LOST


def test_a_close_past_the_lease_is_a_loss() -> None:
    m = registered(now=100.0)
    assert m.disconnected("session timeout", None, 110.0) == Lose("session timeout")


def riding(now: float = 100.0) -> MemberStateMachine[Chan]:
    m = registered(now=now)
    m.released(positions(40, SlotRange(200, 299)))  # a stop's final positions
    m.disconnected("peer closed the connection", None, now + 1)
    return m


def test_a_claim_carries_what_runs_and_what_was_released_and_keeps_the_lease() -> None:
    m = riding(now=100.0)
    m.begin_discovery(102.0)
    m.begin_registration()
    with pytest.raises(ValueError, match="held"):
        m.register_request(102.0)
    held_positions = positions(10, LOW, HIGH)
    request = m.register_request(102.0, (RangeSet([LOW, HIGH]), held_positions))
    claim = request.claim
    assert claim is not None
    assert (claim.member_id, claim.member_epoch, claim.coordinator_epoch) == ("m-1", 1, 3)
    assert ranges_from_wire(claim.owned) == RangeSet([LOW, HIGH])
    assert positions_from_wire(claim.positions) == {
        TP: [(LOW, Position(10)), (HIGH, Position(10)), (SlotRange(200, 299), Position(40))]
    }
    assert held_positions == positions(10, LOW, HIGH)  # the member's own map is untouched
    assert m.heard_ago(102.0) == 2.0  # sending a claim renews nothing


def test_an_adopted_claim_keeps_the_session_and_what_was_adopted() -> None:
    m = riding(now=100.0)
    m.begin_discovery(102.0)
    m.begin_registration()
    m.register_request(102.0, (RangeSet([LOW, HIGH]), positions(10, LOW, HIGH)))
    back = response(member_id="m-1", epoch=2, coordinator_epoch=4, adopted=[(0, 99)])
    assert m.settle(back) == Adopted(RangeSet([LOW]))
    m.registered(back, Chan("c2"), "b:2", 103.0)
    assert (member_id(m), m.epoch, m.coordinator_epoch, m.session) == ("m-1", 2, 4, 1)
    assert m.served_by == "b:2" and state(m) is MemberState.MEMBER
    m.disconnected("peer closed the connection", None, 104.0)
    m.begin_registration()
    claim = m.register_request(104.0, (RangeSet([LOW]), positions(12, LOW))).claim
    assert claim is not None  # the released positions went with the adopted claim
    assert positions_from_wire(claim.positions) == positions(12, LOW)


def test_a_claim_not_taken_is_a_loss_then_a_new_session() -> None:
    m = riding(now=100.0)
    m.begin_discovery(102.0)
    m.begin_registration()
    m.register_request(102.0, (RangeSet([LOW]), positions(10, LOW)))
    other = response(member_id="m-2", epoch=1, coordinator_epoch=4)
    assert m.settle(other) == Fresh(Lose("the new coordinator did not take our claim"))
    assert member_id(m) is None and state(m) is MemberState.LOST
    m.registered(other, Chan("c2"), "b:2", 103.0)
    assert (member_id(m), m.session, state(m)) == ("m-2", 2, MemberState.MEMBER)


def test_retries_back_off_but_not_past_the_lease_and_start_over_when_registered() -> None:
    m = machine()
    delays = [m.retry_delay(0.0) for _ in range(7)]
    assert delays == [FIRST_RETRY_S, 0.2, 0.4, 0.8, 1.6, LAST_RETRY_S, LAST_RETRY_S]
    m = riding(now=100.0)  # registered (the backoff starts over), then riding
    assert m.retry_delay(101.0) == FIRST_RETRY_S
    assert [m.retry_delay(109.5) for _ in range(3)] == [0.2, 0.4, 0.5]  # the lease left
    assert m.retry_delay(109.99) == MIN_RETRY_S
    assert [m.retry_delay(101.0) for _ in range(3)] == [PROBE_INTERVAL_S] * 3, "riding: often"


def test_two_closes_in_a_row_after_the_tls_handshake_are_a_refusal() -> None:
    m = machine()
    assert not m.tls_close_is_final()
    assert m.tls_close_is_final()
    m = machine()
    assert not m.tls_close_is_final()
    m.begin_discovery(0.0)
    m.begin_registration()
    m.register_request(0.0)
    m.registered(response(), Chan("c"), "a:1", 0.0)  # a registration in between
    assert not m.tls_close_is_final()


def test_leaving_hands_the_positions_over_and_registers_no_more() -> None:
    assert machine().leave_request({}) is None  # never registered: nothing to say
    m = registered()
    leave = m.leave_request(positions(5, LOW))
    assert isinstance(leave, LeaveRequest)
    assert (leave.member_id, leave.member_epoch) == ("m-1", 1)
    assert positions_from_wire(leave.positions) == positions(5, LOW)
    assert m.closing and state(m) is MemberState.LEFT


def test_standing_aside_hands_the_positions_over_and_registers_anew_once_readable() -> None:
    m = registered(channel=Chan("c1"))
    leave = m.step_aside(positions(7, LOW))
    assert isinstance(leave, LeaveRequest)
    assert (leave.member_id, leave.member_epoch) == ("m-1", 1)
    assert positions_from_wire(leave.positions) == positions(7, LOW)
    assert state(m) is MemberState.ASIDE and m.aside and not m.closing
    assert member_id(m) is None and m.channel is None and not m.claims
    assert isinstance(m.on_request(Chan("c1"), ping(), 101.0), Ignore)  # the old channel
    m.rejoin()
    assert state(m) is MemberState.DISCOVER and not m.aside
    assert m.begin_discovery(102.0) is None  # a new member: no claim, no lease to keep
    m.begin_registration()
    assert m.register_request(102.0).claim is None
    assert m.settle(response("m-2")) == Fresh()
    m.registered(response("m-2"), Chan("c2"), "a:1", 102.0)
    assert (member_id(m), m.session) == ("m-2", 2)  # work of the old session is stale


def test_a_member_not_registered_stands_aside_with_nothing_to_say() -> None:
    m = machine()
    assert m.step_aside({}) is None
    assert state(m) is MemberState.ASIDE
    m.rejoin()
    assert state(m) is MemberState.DISCOVER


def test_a_ping_reply_reports_what_the_hooks_say() -> None:
    report = PingReport(
        positions(3, LOW), load={2: 5}, fetched=[Fetched(TP, 0, 10, {2: 9})], busy_records=5,
        busy_ms=12, fetch_silences={TP: 7.25, ("t", 1): 1e9},
    )  # fmt: skip
    reply = ping_response(ping(member_epoch=4), report)
    assert reply.member_epoch == 4 and reply.load == {2: 5}
    assert positions_from_wire(reply.positions) == positions(3, LOW)
    assert [(w.topic, w.partition, w.start, w.end, w.buckets) for w in reply.fetched] == [
        ("t", 0, 0, 10, {2: 9})
    ]
    assert (reply.busy_records, reply.busy_ms) == (5, 12)
    silences = [(f.topic, f.partition, f.ms) for f in reply.fetch_silences]
    assert silences == [("t", 0, 7250), ("t", 1, 2**31 - 1)]  # past the wire's bound: capped


requests = st.lists(
    st.tuples(
        st.floats(0.0, 6.0),  # seconds since the previous request
        st.integers(0, 6),  # its coordinator epoch
        st.integers(1, 6),  # its member epoch
    ),
    max_size=40,
)


@given(requests)
def test_epochs_never_go_back_and_only_applied_requests_renew_the_lease(
    arrivals: list[tuple[float, int, int]],
) -> None:
    """Any order of requests from any coordinator epochs: a request older than the newest
    epoch seen is refused; the coordinator and member epochs are running maxima of the
    applied ones; the lease runs from the last applied request."""
    channel = Chan("c")
    now = 100.0
    m = registered(now=now, channel=channel)  # coordinator epoch 3, member epoch 1
    newest, epoch, heard = 3, 1, now
    for gap, coordinator_epoch, member_epoch in arrivals:
        now += gap
        decision = m.on_request(channel, ping(member_epoch, coordinator_epoch), now)
        if coordinator_epoch < newest:
            assert isinstance(decision, Refuse)
        else:
            assert decision == Apply()
            newest, epoch, heard = coordinator_epoch, max(epoch, member_epoch), now
        assert (m.coordinator_epoch, m.epoch) == (newest, epoch)
        assert m.heard_ago(now) == pytest.approx(now - heard)
        assert isinstance(m.watch(now), Expired) == (now - heard >= SESSION_MS / 1000)
