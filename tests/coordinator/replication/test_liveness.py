"""Serve, hold or let go when beats stop reaching Kafka: the rule on a fake clock."""

from __future__ import annotations

from keyshard.coordinator.replication.liveness import (
    BeatPartitionView,
    Standing,
    Verdict,
    standing,
)

TIMEOUT = 2.0  # replica timeout: others alive, a replica lets go at 1 s of silence
HOLD = 20.0
T0 = 1000.0  # loop time of the last beat that got through


def judge(
    now: float,
    view: BeatPartitionView,
    *,
    others_alive: bool = True,
    others_heard_at: float | None = T0 + 0.5,
) -> Verdict:
    """By default the others' beats still arrive while ours do not: this replica is the
    odd one out, and only the beat partition's metadata can tell of a failover."""
    return standing(
        now=now,
        last_beat_at=T0,
        view=view,
        others_alive=others_alive,
        others_heard_at=others_heard_at,
        replica_timeout_s=TIMEOUT,
        hold_limit_s=HOLD,
    )


def led_by(leader: int | None, answers: bool = True) -> BeatPartitionView:
    """Broker `leader` led the beat partition all along; the cluster answered just now."""
    return BeatPartitionView().seen(T0 - 30, 1, True).seen(T0 - 30, leader, answers)


def test_beats_that_get_through_keep_a_replica_serving() -> None:
    assert judge(T0 + 0.9, led_by(1)).standing is Standing.SERVING


def test_a_replica_that_cannot_reach_kafka_is_cut_off_as_before() -> None:
    """No broker answered since before the silence: isolation, whatever the last answer
    said of the leader."""
    for view in (led_by(1), led_by(None), led_by(2, answers=False), BeatPartitionView()):
        verdict = judge(T0 + 1.0, view)
        assert verdict.standing is Standing.CUT_OFF, view
        assert verdict.reason == "no beat of ours reached Kafka for 1.0 s"


def test_a_leaderless_beat_partition_holds_while_the_cluster_answers() -> None:
    view = led_by(1).seen(T0 + 0.5, None, False)
    assert judge(T0 + 1.0, view.seen(T0 + 1.0, None, False)).standing is Standing.HOLDING
    later = view.seen(T0 + 12, None, False)
    verdict = judge(T0 + 12, later)
    assert verdict.standing is Standing.HOLDING
    assert "has no leader" in verdict.reason


def test_a_leader_that_does_not_answer_is_a_crashed_broker_until_kafka_notices() -> None:
    """After a kill -9 the metadata names the dead broker as leader for Kafka's
    broker.session.timeout.ms: the cluster answers, the leader does not."""
    view = led_by(1).seen(T0 + 9, 1, False)
    verdict = judge(T0 + 9, view)
    assert verdict.standing is Standing.HOLDING
    assert "broker 1, which does not answer" in verdict.reason


def test_an_in_sync_follower_that_does_not_answer_holds_writes_up() -> None:
    """A crashed follower stays in the in-sync replicas until Kafka notices: acks=all
    writes to a partition whose leader is alive wait for it meanwhile."""
    view = led_by(1).seen(T0 + 1.0, 1, True, silent_follower=3)
    verdict = judge(T0 + 1.0, view)
    assert verdict.standing is Standing.HOLDING
    assert "waits for broker 3" in verdict.reason
    assert judge(T0 + 1.0, led_by(1).seen(T0 + 1.0, 1, True)).standing is Standing.CUT_OFF


def test_writes_that_waited_for_a_failover_complete_a_moment_after_it() -> None:
    """Kafka dropped the crashed follower from the in-sync replicas: the writes that
    waited for it complete a moment later, and until then the silence is still its."""
    fixed = led_by(1).seen(T0 + 9.0, 1, True, silent_follower=3).seen(T0 + 9.5, 1, True)
    assert judge(T0 + 9.5, fixed).standing is Standing.HOLDING
    later = fixed.seen(T0 + 11.5, 1, True)
    assert judge(T0 + 11.5, later).standing is Standing.CUT_OFF


def test_a_new_leader_holds_until_a_beat_gets_through_to_it() -> None:
    """A controlled shutdown moved the leader: clients catch up after an election."""
    moved = led_by(1).seen(T0 + 0.4, 2, True).seen(T0 + 1.5, 2, True)
    assert judge(T0 + 1.5, moved).standing is Standing.HOLDING
    # The same leader as when our last beat got through: nothing explains the silence.
    assert judge(T0 + 1.5, led_by(1).seen(T0 + 1.5, 1, True)).standing is Standing.CUT_OFF


def test_an_election_just_before_the_last_beat_read_back_still_explains_the_silence() -> None:
    """A controlled shutdown: the leader moves, and a beat written to the old one is
    read back just after; the clients catch up with the new leader later."""
    moved = led_by(1).seen(T0 - 0.3, 2, True).seen(T0 + 1.0, 2, True)
    assert judge(T0 + 1.0, moved).standing is Standing.HOLDING


def test_holding_ends_with_the_hold_limit() -> None:
    view = led_by(1).seen(T0 + HOLD, None, False)
    verdict = judge(T0 + HOLD, view)
    assert verdict.standing is Standing.CUT_OFF
    assert "lasted longer than 20 s" in verdict.reason


def test_the_cluster_must_have_answered_lately_to_hold() -> None:
    """An answer older than the replica timeout is no proof the cluster is reachable now."""
    stale = led_by(1).seen(T0 + 0.5, None, False)
    assert judge(T0 + 2.4, stale).standing is Standing.HOLDING
    assert judge(T0 + 2.6, stale).standing is Standing.CUT_OFF


def test_only_an_answer_after_the_last_beat_tells_of_a_failover() -> None:
    """What the cluster said before our beats stopped getting through is no answer to
    why they stopped: an isolated replica hears nothing after its last beat."""
    before = led_by(1).seen(T0 - 0.1, None, False)
    assert judge(T0 + 1.0, before).standing is Standing.CUT_OFF


def test_a_lone_replica_waits_longer_before_either() -> None:
    view = led_by(1).seen(T0 + 2.9, 1, True)
    assert judge(T0 + 2.9, view, others_alive=False).standing is Standing.SERVING
    assert judge(T0 + 3.0, view, others_alive=False).standing is Standing.CUT_OFF
    leaderless = led_by(1).seen(T0 + 3.0, None, False)
    assert judge(T0 + 3.0, leaderless, others_alive=False).standing is Standing.HOLDING


def test_the_first_answer_elects_nobody() -> None:
    """A replica's first look at the cluster is no election it saw happen."""
    first = BeatPartitionView().seen(T0 + 1.0, 3, True)
    assert first.leader_since < T0
    assert judge(T0 + 1.0, first).standing is Standing.CUT_OFF


def test_a_silence_every_replica_shares_is_kafkas_before_the_metadata_shows_it() -> None:
    """The beat partition's leader looks fine in the last answer (Kafka has not noticed
    the crash yet, or the answer came before the election), but nobody's beats arrive:
    holding. Once another replica's beat is read while ours still are not, this one is
    the odd one out and lets go."""
    answered = led_by(1).seen(T0 + 0.9, 1, True)
    for heard in (None, T0 - 0.3, T0):
        verdict = judge(T0 + 1.0, answered, others_heard_at=heard)
        assert verdict.standing is Standing.HOLDING, heard
        assert "has carried no replica's beat since ours stopped" in verdict.reason
    assert judge(T0 + 1.0, answered, others_heard_at=T0 + 0.2).standing is Standing.CUT_OFF


def test_a_shared_silence_needs_an_answer_and_ends_with_the_hold_limit() -> None:
    """An isolated replica hears neither the others nor the cluster: cut off, as before."""
    assert judge(T0 + 1.0, led_by(1), others_heard_at=T0 - 1.0).standing is Standing.CUT_OFF
    late = led_by(1).seen(T0 + HOLD, 1, True)
    verdict = judge(T0 + HOLD, late, others_heard_at=T0 - 1.0)
    assert verdict.standing is Standing.CUT_OFF
    assert "lasted longer than 20 s" in verdict.reason


def test_a_lone_replica_has_no_silence_to_share() -> None:
    answered = led_by(1).seen(T0 + 2.9, 1, True)
    verdict = judge(T0 + 3.0, answered, others_alive=False, others_heard_at=None)
    assert verdict.standing is Standing.CUT_OFF
