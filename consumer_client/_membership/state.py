"""The member's side of the protocol, sans I/O: docs/protocol.md §6.1 and §7.

`MemberStateMachine` holds what a member knows — its member id and epoch, the newest
coordinator epoch it heard, when a coordinator last spoke to it (its lease), the final
positions of ranges it released since it registered, the requests that arrive while a
registration settles — and makes every decision the protocol asks of a member: what to
register with, whether a request is applied, held, ignored or refused (and with which
error), when a silent coordinator is suspected and the other addresses asked, whether a
lost channel is ridden through or ends the session.

It reads no clock, opens no socket and awaits nothing: time comes in as `now` (seconds of
a monotonic clock), decisions go out as values. The connector
(`_membership.connector.Membership`) is the I/O shell that carries them out, as the
coordinator's runtime carries out its pure group handlers. Generic in the channel type
`C`, which it only compares: a request from a channel given up on is ignored.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from keyshard.consumer_client._membership.claim_fit import fit_before_authentication
from keyshard.consumer_client._membership.member_hooks import PingReport, TopicsChange, Transition
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import (
    MAX_INT32,
    ErrorCode,
    ErrorResponse,
    FetchedWindow,
    FetchSilence,
    LeaveRequest,
    MemberClaim,
    Message,
    MetadataResponse,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from keyshard.core.protocol.wire import positions_to_wire, ranges_from_wire, ranges_to_wire

C = TypeVar("C")

#: A channel closed with one of these means this member is out: stop everything.
FENCED_CODES = frozenset({ErrorCode.FENCED_MEMBER, ErrorCode.UNKNOWN_MEMBER})
#: Refusals of a registration that registering again cannot fix.
FATAL_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC,
        ErrorCode.AUTHENTICATION_FAILED,
        # As Kafka's consumer raises GroupAuthorizationException: an operator must grant.
        ErrorCode.AUTHORIZATION_FAILED,
        ErrorCode.INCONSISTENT_TOPICS,
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.INVALID_RANGES,
        # The coordinator's bounds (its operator's to change): as Kafka's consumer does.
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.TOO_MANY_GROUPS,
    }
)
#: Silent this long (as a share of the session timeout), a member asks around whether its
#: group is served elsewhere now (pings come every third of it).
SUSPECT_SHARE = 0.5
#: How often a member that suspects its coordinator asks around, and how long it waits
#: for each answer.
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 2.0
#: Between rounds of registration attempts: doubling from the first to the last.
FIRST_RETRY_S = 0.1
LAST_RETRY_S = 2.0
#: The shortest wait the machine asks for: a lease about to run out is still looked at
#: again, not spun on.
MIN_WAIT_S = 0.01
MIN_RETRY_S = 0.05


class MemberState(enum.Enum):
    """docs/protocol.md §6.1."""

    DISCOVER = "discover"  # no member id: looking for the coordinator, to register anew
    RIDING = "riding"  # no channel; member id and ranges kept while the lease lasts (§7.4)
    REGISTER = "register"  # a Register is out; the coordinator's requests wait for it
    MEMBER = "member"  # registered; a coordinator spoke within SUSPECT_SHARE of the session
    SUSPECT = "suspect"  # registered but silent past SUSPECT_SHARE: asking the addresses
    LOST = "lost"  # fenced, lease over or claim refused: everything stops, then DISCOVER
    ASIDE = "aside"  # left the group, cannot read Kafka: registers again once it can
    LEFT = "left"  # closing: registers no more
    FAILED = "failed"  # refused for good (a setting is wrong)


# ---- decisions ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lose:
    """Run the LOST procedure (§6.1): stop every fetcher, drop every queue, abandon
    in-flight work; the next registration is a new member's. `fenced`: the coordinator
    said so (rather than a lease that ran out or a claim that was not taken)."""

    reason: str
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class RideThrough:
    """Keep running every owned range and look for the coordinator, for `lease_left_s`."""

    reason: str
    lease_left_s: float


@dataclass(frozen=True, slots=True)
class Adopted:
    """The coordinator took the claim: keep `kept`, stop the rest at once (no report)."""

    kept: RangeSet


@dataclass(frozen=True, slots=True)
class Fresh:
    """A new member. `loss`: a claim was sent and not taken, so the LOST procedure runs
    first."""

    loss: Lose | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until the channel closes or `seconds` pass; then ask `watch` again."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask the known addresses who serves the group, giving up after `within_s` (the
    lease left); when none names another coordinator, wait `then_wait_s` and ask again."""

    within_s: float
    then_wait_s: float


@dataclass(frozen=True, slots=True)
class Expired:
    """No valid request for a session timeout: close the channel; the lease is over."""


@dataclass(frozen=True, slots=True)
class Apply:
    """A valid Ping, StartFetcher or StopFetcher: apply it and reply."""


@dataclass(frozen=True, slots=True)
class Hold:
    """A registration is settling: the request is applied after it, in order."""


@dataclass(frozen=True, slots=True)
class Ignore:
    """From a channel given up on: answering would speak for a member that is gone."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Reply `error` and apply nothing (a fenced coordinator still talking, §7.3)."""

    error: ErrorResponse


@dataclass(frozen=True, slots=True)
class Unexpected:
    """Not a request a coordinator may send: fail the channel with this message."""

    message: str


RequestDecision = Apply | Hold | Ignore | Refuse | Unexpected


@dataclass(frozen=True, slots=True)
class Registration:
    """Who the member is, as every Register says it (docs/protocol.md §4.3)."""

    group: str
    topics: list[str]
    name: str
    session_timeout_ms: int
    capacity: int
    auth_token: str | None = field(default=None, repr=False)  # a secret: kept out of logs
    topic_pattern: str | None = None  # instead of `topics`


class MemberStateMachine(Generic[C]):
    """One member's side of the protocol. The connector drives it so:

    - before each round of registration attempts: `lease_ran_out` (a `Lose` to carry
      out, or None), then `begin_discovery` (how long the round may take);
    - on a connected channel: `begin_registration`, `register_request`; with the answer
      `settle` (an `Adopted` or a `Fresh` to carry out), then `registered` (the requests
      held meanwhile, to apply); on a failure `abandon_registration`, and `retry_delay`
      once every address failed;
    - while registered: `on_request` for each request, `watch` about the silence, `moved`
      for each probe's answer, `released` for each stop drained, `disconnected` when the
      channel is gone (a `Lose` or a `RideThrough`);
    - at the end: `leave_request`.
    """

    def __init__(
        self,
        *,
        group: str,
        topics: list[str],
        name: str,
        session_timeout_ms: int,
        capacity: int,
        auth_token: str | None = None,
        topic_pattern: str | None = None,
    ) -> None:
        if bool(topics) == (topic_pattern is not None):
            raise ValueError("give topics (at least one) or topic_pattern, not both")
        if topic_pattern is not None:
            try:
                re.compile(topic_pattern)
            except re.error as err:
                raise ValueError(
                    f"topic_pattern {topic_pattern!r} is not a regular expression: {err}"
                ) from None
        self.registration = Registration(
            group, list(topics), name, session_timeout_ms, capacity, auth_token, topic_pattern
        )
        self._state = MemberState.DISCOVER
        self.member_id: str | None = None
        self.epoch = 0
        # The newest coordinator epoch heard: requests of an older one are refused.
        self.coordinator_epoch = 0
        # Bumped on every fresh registration: work of older sessions is stale. Not when a
        # claim is adopted: the work in flight is still this member's.
        self.session = 0
        self.closing = False
        # The channel registered on: requests from any other are ignored.
        self.channel: C | None = None
        # The coordinator registered with, as Metadata named it: asked last when silent.
        self.served_by = ""
        self._last_heard: float | None = None
        # Final positions of ranges stopped since the last registration: their replies may
        # have gone to a coordinator that died; a claim carries them again.
        self._released: PositionUpdate = {}
        # Requests that arrived while a registration settles, in order (None: not holding).
        self._held: list[tuple[C, Message]] | None = None
        self._claim: MemberClaim | None = None  # the claim of the registration under way
        self._retry_s = FIRST_RETRY_S
        self._tls_closes = 0  # closes right after our TLS handshake, in a row

    @property
    def state(self) -> MemberState:
        """Where the member is in docs/protocol.md §6.1 (LEFT from the moment it closes)."""
        return MemberState.LEFT if self.closing else self._state

    @property
    def timeout_s(self) -> float:
        return self.registration.session_timeout_ms / 1000

    # ---- the lease (§7.1) ----------------------------------------------------------

    def heard_ago(self, now: float) -> float | None:
        """Seconds since a coordinator last spoke to this member (None: none ever did)."""
        return None if self._last_heard is None else now - self._last_heard

    def _silent_s(self, now: float) -> float:
        return now - (now if self._last_heard is None else self._last_heard)

    def lease_left(self, now: float) -> float:
        """A member may run its ranges for a session timeout after it last heard from a
        coordinator."""
        return self.timeout_s - self._silent_s(now)

    def _lease_over(self, now: float) -> bool:
        return self._silent_s(now) >= self.timeout_s

    # ---- registering (§6.1 DISCOVER, REGISTER; §7.4) -------------------------------

    @property
    def claims(self) -> bool:
        """The next registration carries a claim (the member is riding through)."""
        return self.member_id is not None

    def lease_ran_out(self, now: float) -> Lose | None:
        """Before a registration attempt: a member riding through whose lease ran out
        before a coordinator took its claim is lost."""
        if self.member_id is None or not self._lease_over(now):
            return None
        return self._lose(Lose("the lease ran out before a coordinator took the claim"))

    def begin_discovery(self, now: float) -> float | None:
        """A round of registration attempts begins: how long it may take. A claim is not
        worth more than the lease left, whatever the addresses make it wait; a new member
        has no such bound."""
        if self.member_id is None:
            self._state = MemberState.DISCOVER
            return None
        self._state = MemberState.RIDING
        return self.lease_left(now)

    def begin_registration(self) -> None:
        """A channel to the coordinator is open: hold its requests until settled."""
        self._state = MemberState.REGISTER
        self._held = []

    def register_request(
        self, now: float, held: tuple[RangeSet, PositionUpdate] | None = None
    ) -> RegisterRequest:
        """The Register to send, with a claim when riding through: the ranges still run
        (`held`, from `MemberHooks.held`) and their positions, plus the final positions of
        ranges released since the last registration, as many as fit before
        authentication (`claim_fit`). A new member starts its lease clock at the send; a
        claim does not touch it."""
        claim = None
        if self.member_id is not None:
            if held is None:
                raise ValueError("a member riding through registers with a claim: pass `held`")
            owned, positions = held
            merged = {tp: list(segments) for tp, segments in positions.items()}
            for tp, segments in self._released.items():
                merged.setdefault(tp, []).extend(segments)
            claim = MemberClaim(
                member_id=self.member_id,
                member_epoch=self.epoch,
                owned=ranges_to_wire(owned),
                positions=positions_to_wire(merged),
                coordinator_epoch=self.coordinator_epoch,
            )
        else:
            self._last_heard = now
        r = self.registration
        request = fit_before_authentication(
            RegisterRequest(
                correlation_id=0,
                group=r.group,
                topics=r.topics,
                topic_pattern=r.topic_pattern,
                consumer_name=r.name,
                session_timeout_ms=r.session_timeout_ms,
                capacity=r.capacity,
                auth_token=r.auth_token,
                claim=claim,
            )
        )
        self._claim = request.claim
        return request

    @staticmethod
    def refusal_is_fatal(code: ErrorCode) -> bool:
        """A Register refused with `code`: True when registering again cannot help."""
        return code in FATAL_CODES

    def settle(self, response: RegisterResponse) -> Adopted | Fresh:
        """What taking `response` in asks of the member before `registered`."""
        claim = self._claim
        if claim is not None and response.member_id == claim.member_id:
            return Adopted(ranges_from_wire(response.adopted))
        if claim is not None:
            return Fresh(self._lose(Lose("the new coordinator did not take our claim")))
        return Fresh()

    def registered(
        self, response: RegisterResponse, channel: C, served_by: str, now: float
    ) -> list[tuple[C, Message]]:
        """The registration is settled: the member is `response`'s, on `channel`. Returns
        the requests held meanwhile, to apply now, in order."""
        claim = self._claim
        if claim is None or response.member_id != claim.member_id:
            self.session += 1
        self._state = MemberState.MEMBER
        self._last_heard = now
        self._released = {}
        self._claim = None
        self._tls_closes = 0
        self._retry_s = FIRST_RETRY_S
        self.member_id = response.member_id
        self.epoch = response.member_epoch
        self.coordinator_epoch = max(self.coordinator_epoch, response.coordinator_epoch)
        self.channel = channel
        self.served_by = served_by
        held, self._held = self._held or [], None
        return held

    def abandon_registration(self) -> None:
        """The registration under way failed (refused, timed out, cancelled)."""
        self._held = None
        self._claim = None
        if self._state is MemberState.REGISTER:
            self._state = MemberState.DISCOVER if self.member_id is None else MemberState.RIDING

    def retry_delay(self, now: float) -> float:
        """Every address failed: how long to wait before the next round. Backing off (a
        wrong address is not worth 20 connection attempts a second), but a member riding
        through looks again every `PROBE_INTERVAL_S` at most, and before its lease runs
        out: a coordinator restarted in place takes its claims a few seconds after it
        went away, and a 2 s wait would spend a third of a 6 s lease after it is back."""
        delay = self._retry_s
        if self.member_id is not None:
            delay = min(delay, PROBE_INTERVAL_S, max(MIN_RETRY_S, self.lease_left(now)))
        self._retry_s = min(self._retry_s * 2, LAST_RETRY_S)
        return delay

    def tls_close_is_final(self) -> bool:
        """A channel closed right after our TLS handshake, before a byte: True when it is
        the second in a row, a refusal (once, it may be a coordinator shutting down)."""
        self._tls_closes += 1
        return self._tls_closes >= 2

    # ---- a registered member (§6.1 MEMBER, §7.4 step 1) ----------------------------

    def watch(self, now: float) -> Expired | Probe | Wait:
        """What to do about a coordinator's silence now. Silent half the session, the
        member asks around, again and again until it speaks (the replicas notice a dead
        one only after their own timeout: asked too early, they still name it)."""
        silent, timeout = self._silent_s(now), self.timeout_s
        if silent >= timeout:
            return Expired()
        if silent >= SUSPECT_SHARE * timeout:
            if self._state is MemberState.MEMBER:
                self._state = MemberState.SUSPECT
            left = timeout - silent
            return Probe(within_s=left, then_wait_s=max(MIN_WAIT_S, min(PROBE_INTERVAL_S, left)))
        return Wait(max(MIN_WAIT_S, SUSPECT_SHARE * timeout - silent))

    def probe_order(self, addresses: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The known addresses, the coordinator registered with at the end: when it went
        silent (frozen, cut off) it may still accept a connection and then answer nothing
        until a timeout, which a claim has no time for."""
        return sorted(addresses, key=lambda a: f"{a[0]}:{a[1]}" == self.served_by)

    def moved(self, answer: MetadataResponse) -> bool | None:
        """What a probe's answer says: True when the group is served elsewhere now (another
        coordinator, or a newer coordinator epoch), False when it is not, None when this
        answer does not tell (an inactive replica)."""
        if not answer.active:
            return None
        newer = answer.coordinator_epoch > self.coordinator_epoch
        return newer or answer.coordinator != self.served_by

    def disconnected(self, reason: str, error: ErrorCode | None, now: float) -> Lose | RideThrough:
        """The channel is gone (`error`: the code the coordinator closed it with). Fenced,
        or past the lease: lost. Otherwise the member rides through (§7.4)."""
        self.channel = None
        if error in FENCED_CODES:
            return self._lose(Lose(reason, fenced=True))
        if self._lease_over(now):
            return self._lose(Lose(reason))
        self._state = MemberState.RIDING
        return RideThrough(reason, self.lease_left(now))

    def _lose(self, loss: Lose) -> Lose:
        self._state = MemberState.LOST
        self.member_id = None
        self._released = {}
        return loss

    # ---- the coordinator's requests (§6.1 MEMBER, §7.3) ----------------------------

    def on_request(self, channel: C, message: Message, now: float) -> RequestDecision:
        """Whether a request from the coordinator is applied; a valid one renews the lease
        and raises the member epoch to the request's."""
        if self._held is not None:
            self._held.append((channel, message))
            return Hold()
        if channel is not self.channel:
            return Ignore()
        epoch = getattr(message, "coordinator_epoch", None)
        if epoch is not None and epoch < self.coordinator_epoch:
            return Refuse(
                ErrorResponse(
                    correlation_id=0,
                    code=ErrorCode.STALE_COORDINATOR,
                    message=f"coordinator epoch {epoch} is older than {self.coordinator_epoch}",
                )
            )
        if not isinstance(message, PingRequest | StartFetcherRequest | StopFetcherRequest):
            return Unexpected(f"a coordinator may not send {message.type}")
        self.coordinator_epoch = message.coordinator_epoch
        self._last_heard = now
        self.epoch = max(self.epoch, message.member_epoch)
        if self._state is MemberState.SUSPECT:
            self._state = MemberState.MEMBER
        return Apply()

    def released(self, final: PositionUpdate) -> None:
        """A stopped range's final positions, kept for a claim until a registration."""
        for tp, segments in final.items():
            self._released.setdefault(tp, []).extend(segments)

    # ---- standing aside while Kafka cannot be read (§7.6) ---------------------------

    @property
    def aside(self) -> bool:
        return self._state is MemberState.ASIDE

    def step_aside(self, positions: PositionUpdate) -> LeaveRequest | None:
        """This member cannot read Kafka: the Leave that hands `positions` to the members
        that can (None: it is not a member). It forgets its member id and registers again,
        as a new member, once `rejoin` says it can read."""
        leave = self._leave(positions)
        self._state = MemberState.ASIDE
        self.member_id = None
        self.channel = None
        self._released = {}
        return leave

    def rejoin(self) -> None:
        """Kafka can be read again: look for the coordinator and register anew."""
        if self._state is MemberState.ASIDE:
            self._state = MemberState.DISCOVER

    # ---- leaving (§6.1, §8.2) ------------------------------------------------------

    def begin_closing(self) -> None:
        """The application closes: register no more."""
        self.closing = True

    def leave_request(self, positions: PositionUpdate) -> LeaveRequest | None:
        """The Leave that hands `positions` to the next owners (None: not a member)."""
        self.begin_closing()
        return self._leave(positions)

    def _leave(self, positions: PositionUpdate) -> LeaveRequest | None:
        if self.member_id is None:
            return None
        return LeaveRequest(
            correlation_id=0,
            member_id=self.member_id,
            member_epoch=self.epoch,
            positions=positions_to_wire(positions),
        )

    def failed(self) -> None:
        self._state = MemberState.FAILED


# ---- replies ----------------------------------------------------------------------------


def ping_response(request: PingRequest, report: PingReport) -> PingResponse:
    return PingResponse(
        correlation_id=0,
        member_epoch=request.member_epoch,
        positions=positions_to_wire(report.positions),
        load=report.load,
        high_watermarks=report.high_watermarks,
        fetched=[
            FetchedWindow(
                topic=f.tp[0], partition=f.tp[1], start=f.start, end=f.end, buckets=f.buckets
            )
            for f in report.fetched
        ],
        busy_records=report.busy_records,
        busy_ms=report.busy_ms,
        fetch_silences=[
            FetchSilence(topic=tp[0], partition=tp[1], ms=min(MAX_INT32, int(s * 1000)))
            for tp, s in report.fetch_silences.items()
        ],
    )


def topics_change(request: StartFetcherRequest) -> TopicsChange:
    return TopicsChange(
        tuple(Transition(t.topic, tuple(t.counts), t.until_ms) for t in request.transitions),
        tuple((d.topic, d.partition) for d in request.dropped),
    )


def start_response(request: StartFetcherRequest) -> StartFetcherResponse:
    return StartFetcherResponse(correlation_id=0, member_epoch=request.member_epoch)


def stop_response(request: StopFetcherRequest, final: PositionUpdate) -> StopFetcherResponse:
    return StopFetcherResponse(
        correlation_id=0, member_epoch=request.member_epoch, positions=positions_to_wire(final)
    )
