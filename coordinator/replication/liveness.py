"""Whether a replica whose beats stop reaching Kafka may keep serving: pure functions of
what it observed (its beats, and what the cluster's metadata says of the partition the
beats go to), so the rule is tested with a fake clock and the I/O shell only gathers.

Two causes look alike from inside a replica, and call for opposite answers:

- **Isolation**: this replica cannot reach Kafka while the others can. They count it gone
  after the replica timeout (in their own beats) and take its partitions over, so it must
  stop commanding its consumers well before: it is *cut off* and lets go.
- **Kafka's own failover**: the partition the beats go to has no leader, or its leader is
  gone (a crashed broker stays named as leader until the controller notices, after
  `broker.session.timeout.ms`, 9 s by default), or a follower in its in-sync replicas is
  gone (an acks=all write waits for it until the controller notices, just as long), or a
  new leader was just elected and the clients have not caught up. The cluster still
  answers. Nobody's beats get through, so nobody counts anybody gone, and no replica can
  claim a partition meanwhile (a claim writes an epoch marker). Letting go would only turn
  Kafka's hiccup into an outage: the replica *holds*, serving from its image (a grant
  waits for durability, so nothing new is granted) and keeping its consumers' leases
  alive, for at most `hold_limit_s`.

A third sign tells the two apart before the cluster's metadata shows a failover: other
replicas are alive, the cluster answers, and nobody's beats have been read since ours
stopped getting through. An isolated replica gets no answer; one left behind alone reads
the others' beats while its own do not arrive. A silence every replica shares is Kafka's.

A replica that reaches some brokers but not the beat partition's leader, while the other
replicas reach it, looks like the second case and is the first: the others take its
partitions over while it holds. `hold_limit_s` bounds that; `docs/operations/
high-availability.md` says what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: The longest Kafka failover of the beat partition a replica rides through holding: Kafka
#: notices a crashed broker after its broker.session.timeout.ms (9 s by default), then
#: elects, and the clients catch up.
DEFAULT_LEADER_FAILOVER_MS = 20_000
# In replica timeouts: when a lone replica whose beats do not reach Kafka lets go, and how
# long a starting replica leaves a partition to a holder it has not heard from.
LONE_CUT_OFF = 1.5
HELD_PATIENCE = 2.5


def cut_off(silent_s: float, replica_timeout_s: float, *, others_alive: bool = True) -> bool:
    """Whether a replica none of whose beats Kafka has acknowledged or it has read back
    for `silent_s` must stop serving, unless Kafka's own failover explains the silence
    (`standing`): at half the replica timeout, so that it has let go well before the
    others count it gone (they count in their own beats, so a slow reader on their side
    only delays them).

    A replica with no other alive in its view (a replica really cut off from Kafka reads
    no beats, so the others it knew stay alive in its view) waits `LONE_CUT_OFF` timeouts:
    the only one that could take its partitions over is one that starts meanwhile, and
    that one waits `HELD_PATIENCE` timeouts before taking a partition somebody holds
    (`ReplicaManager.desired_owners`). Beats go from a thread of their own
    (`coordinator.storage.beats`), but a join storm that saturates the machine's CPU can
    still make them late: at half the timeout a lone coordinator would drop all its
    members for a delay nobody else could take advantage of."""
    return silent_s >= replica_timeout_s * (0.5 if others_alive else LONE_CUT_OFF)


class Standing(Enum):
    SERVING = "serving"
    HOLDING = "holding"  # Kafka's own failover: serve from the image, claim nothing
    CUT_OFF = "cut off"  # isolated: let go of every partition


@dataclass(frozen=True, slots=True)
class BeatPartitionView:
    """What this replica last learnt of the partition its beats go to (loop times)."""

    answered_at: float | None = None  # a broker last answered our metadata request
    leader: int | None = None  # as that answer named it; None: no leader
    leader_since: float = 0.0  # when that leader (or having none) was first seen
    leader_answers: bool = True  # the leader accepted a connection from us
    # A follower in the partition's in-sync replicas that refused us a connection: an
    # acks=all write waits for it until Kafka drops it from them (a crash, noticed after
    # broker.session.timeout.ms); None: every one answered.
    silent_follower: int | None = None
    # When an answer last showed the partition unwritable (no leader, or a leader or an
    # in-sync follower that does not answer): writes waiting meanwhile complete a moment
    # after Kafka fixed it, so it still explains the silence for a while.
    unwritable_at: float | None = None

    def seen(
        self,
        now: float,
        leader: int | None,
        leader_answers: bool,
        silent_follower: int | None = None,
    ) -> BeatPartitionView:
        """The view after a metadata answer at `now` (the first answer's leader counts as
        there all along: nothing was elected that we know of)."""
        first = self.answered_at is None
        since = self.leader_since if first or leader == self.leader else now
        unwritable = leader is None or not leader_answers or silent_follower is not None
        return BeatPartitionView(
            now, leader, since, leader_answers, silent_follower,
            now if unwritable else self.unwritable_at,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Verdict:
    standing: Standing
    silent_s: float  # since a beat of ours last reached Kafka
    reason: str


def standing(
    *,
    now: float,
    last_beat_at: float,
    view: BeatPartitionView,
    others_alive: bool,
    others_heard_at: float | None,
    replica_timeout_s: float,
    hold_limit_s: float,
) -> Verdict:
    """Serve, hold or let go (see the module docstring).

    1. Beats got through lately (`cut_off` says not yet): serving.
    2. The cluster answered since our last beat got through, within the replica timeout,
       and the beat partition has no leader, a leader or an in-sync follower that does not
       answer us, or a leader elected lately (clients catch up after an election), or
       no beat of another alive replica read since our last one (`others_heard_at`):
       holding, while the silence is shorter than `hold_limit_s`. An isolated replica gets
       no answer after its beats stop, so the answers it has say nothing of a failover;
       one isolated in the middle of a failover holds at most a replica timeout past its
       last answer, and the others count it gone only a replica timeout after their own
       beats get through again.
    3. Otherwise: cut off (the rule for isolation).
    """
    silent = now - last_beat_at
    if not cut_off(silent, replica_timeout_s, others_alive=others_alive):
        return Verdict(Standing.SERVING, silent, "")
    answered = view.answered_at
    reached = (
        answered is not None and answered > last_beat_at and now - answered < replica_timeout_s
    )
    failover = _failover(view, last_beat_at, replica_timeout_s) or _shared_silence(
        others_alive, others_heard_at, last_beat_at
    )
    if reached and failover and silent < hold_limit_s:
        return Verdict(
            Standing.HOLDING,
            silent,
            f"no beat of ours reached Kafka for {silent:.1f} s, but the cluster answers and "
            f"the state partition the beats go to {failover}: Kafka's own failover",
        )
    why = f"no beat of ours reached Kafka for {silent:.1f} s"
    if reached and failover:
        why += f" (Kafka's failover, {failover}, lasted longer than {hold_limit_s:g} s)"
    return Verdict(Standing.CUT_OFF, silent, why)


def _failover(view: BeatPartitionView, last_beat_at: float, recent_s: float) -> str | None:
    """How the beat partition is failing over, if it is, in words; else None. A leader
    elected up to `recent_s` before the last beat that got through counts as new: a beat
    read back (or acknowledged) just after an election may have been written before it,
    while the clients still had the old leader."""
    if view.answered_at is None:
        return None
    if view.leader is None:
        return "has no leader"
    if not view.leader_answers:
        return f"is led by broker {view.leader}, which does not answer"
    if view.silent_follower is not None:
        return f"waits for broker {view.silent_follower}, in sync with it, which does not answer"
    if view.leader_since > last_beat_at - recent_s:
        return f"has a new leader, broker {view.leader}"
    if view.unwritable_at is not None and view.unwritable_at > view.answered_at - recent_s:
        return "could not be written moments ago"
    return None


def _shared_silence(
    others_alive: bool, others_heard_at: float | None, last_beat_at: float
) -> str | None:
    """In words, that no other replica's beat has been read since our last one either
    (None: one was, or there is no other replica to compare with)."""
    if not others_alive or (others_heard_at is not None and others_heard_at > last_beat_at):
        return None
    return "has carried no replica's beat since ours stopped"
