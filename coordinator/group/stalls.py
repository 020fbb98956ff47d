"""Alive means making progress (docs/protocol.md §7.6): a member whose slots have records
waiting and whose positions stand still for a bound has failed, whatever its channel says.

A Ping reply proves the channel, not the work. A member cut off from Kafka alone (a
firewall, a route, a broker listener only it uses) answers Pings as well as any, and so
does one whose handler never completes. What the coordinator checks without taking the
member's word for it: records wait in its slots (the demand the members' fetches report,
`group.demand`, less what it completed since), and its positions do not move (the growth
`group.reports` measured in its Ping replies). Records count as waiting only when another
member reported fetched records, from one bound before the clock started on: a member
alone in its group would be judged on its own word, so it is not. The member's own report
of how long ago each partition was last fetched only names the likely cause in the
verdict.

A member that progresses at all, however slowly, is slow, not failed: demand and speed
move work off it (`group.balance`, `group.speed`). The clock runs only while records wait,
so an idle member is never judged. Pure: time comes in as `now`.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyshard.coordinator.group.demand import buckets_of
from keyshard.coordinator.group.state import GroupState, Member
from keyshard.core.model.positions import TopicPartition

#: The bound when the group sets none. Longer than any session (at most 60 s by default):
#: an honest handler may wait on Kafka's own failovers (a leader elected, a transaction
#: coordinator moved, exactly-once fencing a lost member's producer) for more than one,
#: and Kafka's own consumers get `max.poll.interval.ms` (5 min) for the same reason. A
#: member cut off from Kafka hands its keys back itself, within its
#: `fetch_failure_timeout_ms`; this rule is the backstop for handlers that hang.
DEFAULT_STALL_TIMEOUT_MS = 60_000
#: Fewer records than this estimated waiting in a member's slots is nothing waiting (the
#: demand estimate is fractional).
MIN_WAITING = 1.0


def latest_readers(
    readers: tuple[tuple[str, float], ...], member_id: str, at: float
) -> tuple[tuple[str, float], ...]:
    """`member_id` reported fetched records at `at`: the two latest readers, newest first
    (two are enough to know whether anyone but a given member read lately)."""
    others = tuple(reader for reader in readers if reader[0] != member_id)
    return ((member_id, at), *others[:1])


def read_by_others(readers: tuple[tuple[str, float], ...], member_id: str, *, since: float) -> bool:
    """Whether a member other than `member_id` reported fetched records since `since`:
    the records waiting are then what *they* saw, not the judged member's own word."""
    return any(mid != member_id and at >= since for mid, at in readers)


def stalled_since(
    previous: float | None, *, waiting: float, advanced: bool, now: float
) -> float | None:
    """Since when a member has made no progress while records wait in its slots (None: it
    progresses, or nothing waits). `previous`: the answer for its last Ping reply;
    `advanced`: its positions moved in this one."""
    if advanced or waiting < MIN_WAITING:
        return None
    return now if previous is None else previous


def stall_verdict(
    since: float | None,
    *,
    now: float,
    bound_s: float,
    waiting: float,
    silences: Mapping[TopicPartition, float],
) -> str | None:
    """Why the member has failed (None: it has not): no progress for `bound_s` while
    records wait. `silences`: per partition, seconds since the member last fetched it, as
    it reports them."""
    if since is None or now - since < bound_s:
        return None
    cut = sorted(tp for tp, silent in silences.items() if silent >= bound_s)
    if cut:
        cause = "it has fetched nothing of " + ", ".join(f"{t}[{p}]" for t, p in cut)
    else:
        cause = "its handlers completed none of them"
    return (
        f"no progress for {now - since:.1f} s while about {waiting:.0f} records wait in "
        f"its slots ({cause})"
    )


def judge_progress(
    state: GroupState,
    member: Member,
    *,
    advanced: bool,
    silences: Mapping[TopicPartition, float],
    now: float,
) -> tuple[float | None, str | None]:
    """At one of `member`'s Ping replies: its stall clock (`stalled_since`) and, once that
    reached the group's bound (`stall_timeout_ms`, else `DEFAULT_STALL_TIMEOUT_MS`), why it has
    failed. Costs the member's own load buckets, not the group's size."""
    bound_s = (state.config.stall_timeout_ms or DEFAULT_STALL_TIMEOUT_MS) / 1000
    waiting = 0.0
    # Others' fetches count from one bound before the clock started: a backlog they read
    # once stays waiting while nobody fetches anything new.
    clock_start = now if member.stalled_since is None else member.stalled_since
    if read_by_others(state.readers, member.member_id, since=clock_start - bound_s):
        running = member.owned - member.draining  # a drain has its own deadline
        seen = state.demand.waiting_in(buckets_of(running), now)
        waiting = max(0.0, seen - member.completed_since_ping(now))
    since = stalled_since(member.stalled_since, waiting=waiting, advanced=advanced, now=now)
    verdict = stall_verdict(since, now=now, bound_s=bound_s, waiting=waiting, silences=silences)
    return since, verdict
