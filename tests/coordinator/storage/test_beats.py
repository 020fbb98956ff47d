"""The view of the replicas' beats the main loop reads (`BeatView`): liveness counted in
our own beats in log order, history not taken for life, a leaving replica not alive."""

from __future__ import annotations

from keyshard.coordinator.storage.beats import BeatView
from keyshard.coordinator.storage.log_format import ReplicaBeat


def _beat(replica: str, *, leaving: bool = False) -> ReplicaBeat:
    return ReplicaBeat(replica, f"{replica}:1", f"http://{replica}:2", 0, leaving)


def test_a_replica_is_alive_until_we_have_beaten_the_timeout_since_its_last_beat() -> None:
    view = BeatView().read([(10, _beat("a")), (11, _beat("b"))], "a", live_from=10, now=5.0)
    assert set(view.alive(2)) == {"a", "b"}
    assert (view.own_beats, view.own_beat_seen_at, view.other_beat_seen_at) == (1, 5.0, 5.0)
    view = view.read([(12, _beat("a"))], "a", live_from=10, now=6.0)
    assert set(view.alive(2)) == {"a", "b"}, "one beat of ours since b's"
    view = view.read([(13, _beat("a"))], "a", live_from=10, now=7.0)
    assert set(view.alive(2)) == {"a"}, "two beats of ours since b's: gone"
    assert view.other_beat_seen_at == 5.0


def test_beats_from_before_we_started_are_history_and_a_leaving_one_is_not_alive() -> None:
    view = BeatView().read(
        [(3, _beat("old")), (10, _beat("b", leaving=True)), (11, _beat("a"))], "a",
        live_from=10, now=1.0,
    )  # fmt: skip
    assert set(view.alive(4)) == {"a"}
    assert set(view.beats) == {"old", "b", "a"}, "known (where they were), not alive"


def test_reading_publishes_a_new_view_and_leaves_the_old_one_as_it_was() -> None:
    """The main loop may hold a view while the beat thread reads on."""
    before = BeatView().read([(10, _beat("b"))], "a", live_from=10, now=1.0)
    after = before.read([(11, _beat("a"))], "a", live_from=10, now=2.0)
    assert set(before.beats) == {"b"} and before.own_beats == 0
    assert set(after.beats) == {"a", "b"} and after.own_beats == 1
