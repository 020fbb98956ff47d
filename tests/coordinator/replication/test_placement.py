"""Placement of state partitions on replicas: sticky, balanced, the same on every replica."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from keyshard.coordinator.replication.liveness import HELD_PATIENCE, LONE_CUT_OFF, cut_off
from keyshard.coordinator.replication.placement import ReplicaClaim, assign, take_orphans

names = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True)


def claims(replicas: list[str], holds: dict[str, dict[int, int]]) -> list[ReplicaClaim]:
    return [ReplicaClaim(r, f"{r}:7171", f"http://{r}:7172", holds.get(r, {})) for r in replicas]


def spread(owner: dict[int, str], replicas: list[str]) -> int:
    counts = Counter(owner.values())
    return max(counts[r] for r in replicas) - min(counts[r] for r in replicas)


@given(st.integers(1, 40), names, st.randoms(use_true_random=False))
def test_every_partition_has_one_owner_balanced_and_order_does_not_matter(
    partitions: int, replicas: list[str], rng: random.Random
) -> None:
    holds = {r: {p: rng.randrange(5) for p in range(partitions) if rng.random() < 0.3}
             for r in replicas}  # fmt: skip
    owner = assign(partitions, claims(replicas, holds))
    assert sorted(owner) == list(range(partitions))
    assert set(owner.values()) <= set(replicas)
    assert spread(owner, replicas) <= 1
    shuffled = claims(replicas, holds)
    rng.shuffle(shuffled)
    assert assign(partitions, shuffled) == owner


@given(st.integers(1, 40), names)
def test_a_balanced_assignment_is_kept_as_it_is(partitions: int, replicas: list[str]) -> None:
    first = assign(partitions, claims(replicas, {}))
    held: dict[str, dict[int, int]] = {}
    for p, r in first.items():
        held.setdefault(r, {})[p] = 1
    assert assign(partitions, claims(replicas, held)) == first


def test_the_higher_epoch_keeps_a_partition_two_replicas_claim() -> None:
    """A replica frozen past its session comes back still claiming what was taken over."""
    owner = assign(2, claims(["a", "b"], {"a": {0: 3, 1: 3}, "b": {0: 4}}))
    assert owner == {0: "b", 1: "a"}


def test_a_new_replica_takes_a_fair_share_and_only_that() -> None:
    held = {"a": {p: 1 for p in range(0, 6)}, "b": {p: 1 for p in range(6, 12)}}
    owner = assign(12, claims(["a", "b", "c"], held))
    moved = [p for p, r in owner.items() if r == "c"]
    assert len(moved) == 4 and all(owner[p] == ("a" if p < 6 else "b") for p in
                                   set(range(12)) - set(moved))  # fmt: skip


@given(st.integers(1, 40), names, st.data())
def test_orphans_move_and_nothing_else_does(
    partitions: int, replicas: list[str], data: st.DataObject
) -> None:
    current = assign(partitions, claims(replicas, {}))
    dead = data.draw(st.sets(st.sampled_from(replicas), max_size=len(replicas) - 1))
    alive = [r for r in replicas if r not in dead]
    after = take_orphans(current, partitions, alive)
    assert sorted(after) == list(range(partitions))
    for p, r in current.items():
        if r in alive:
            assert after[p] == r, "a live replica's partition moved"
        else:
            assert after[p] in alive
    assert spread(after, alive) <= 1 + max(0, spread(current, replicas))
    assert take_orphans(current, partitions, reversed(alive)) == after


def test_the_kafka_rebalance_after_a_takeover_keeps_it() -> None:
    """The fast path and the group leader agree, so a kill -9 moves partitions once."""
    current = assign(6, claims(["a", "b", "c"], {}))
    after = take_orphans(current, 6, ["a", "c"])
    held: dict[str, dict[int, int]] = {}
    for p, r in after.items():
        held.setdefault(r, {})[p] = 2 if current[p] == "b" else 1
    assert assign(6, claims(["a", "c"], held)) == after


def test_a_replica_cut_off_from_kafka_lets_go_well_before_the_others_take_over() -> None:
    assert not cut_off(0.9, replica_timeout_s=2.0)
    assert cut_off(1.0, replica_timeout_s=2.0)
    # However long the timeout, half of it is left between letting go and the takeover.
    for timeout in (1.0, 2.0, 10.0):
        assert cut_off(timeout / 2, timeout) and not cut_off(timeout / 2 - 0.01, timeout)


def test_a_lone_replica_lets_go_later_but_before_a_new_one_takes_over() -> None:
    """Only a replica started meanwhile could take its partitions over, and that one waits
    `HELD_PATIENCE` timeouts for a held partition: a join storm that holds the loop (and
    so the beats) for 2.3 s must not make a lone coordinator drop every member."""
    assert LONE_CUT_OFF < HELD_PATIENCE
    assert not cut_off(2.9, replica_timeout_s=2.0, others_alive=False)
    assert cut_off(3.0, replica_timeout_s=2.0, others_alive=False)
    assert cut_off(1.0, replica_timeout_s=2.0, others_alive=True)
