"""Whether a consumer can read Kafka (`_datapath.reach`): poll timestamps that change
are fetches that succeeded; only partitions asked for count. Time passed in."""

from __future__ import annotations

from keyshard.consumer_client._datapath.reach import FetchReach

A, B = ("t", 0), ("t", 1)


def test_nothing_asked_for_is_not_failing() -> None:
    reach = FetchReach()
    assert reach.failing_for(10.0) is None
    reach.observe({}, 10.0)
    assert reach.failing_for(20.0) is None and reach.silences(20.0) == {}


def test_a_partition_never_polled_fails_from_when_it_was_first_asked_for() -> None:
    reach = FetchReach()
    reach.observe({A: None}, 10.0)
    reach.observe({A: None}, 14.0)
    assert reach.failing_for(15.0) == 5.0


def test_a_poll_timestamp_that_changes_is_a_fetch_that_succeeded() -> None:
    reach = FetchReach()
    reach.observe({A: 1000}, 10.0)
    reach.observe({A: 1000}, 12.0)
    assert reach.failing_for(12.0) == 2.0
    reach.observe({A: 1500}, 13.0)  # an empty fetch answered counts as much as records
    assert reach.failing_for(13.5) == 0.5


def test_failing_means_every_partition_asked_for_is_silent() -> None:
    reach = FetchReach()
    reach.observe({A: 1, B: 1}, 0.0)
    for second in range(1, 30):
        reach.observe({A: 1, B: second + 1}, float(second))  # B keeps answering
    assert reach.failing_for(29.0) == 0.0
    assert reach.silences(29.0) == {A: 29.0, B: 0.0}


def test_a_hold_restarts_every_clock() -> None:
    """Held back (max_pending reached), the consumer asks Kafka for nothing: a slow
    handler is not a broker that cannot be reached."""
    reach = FetchReach()
    reach.observe({A: 1}, 0.0)
    reach.observe({}, 20.0)
    reach.observe({A: 1}, 21.0)
    assert reach.failing_for(22.0) == 1.0


def test_a_partition_no_longer_asked_for_is_forgotten() -> None:
    reach = FetchReach()
    reach.observe({A: 1, B: 1}, 0.0)
    reach.observe({B: 2}, 5.0)
    assert reach.silences(6.0) == {B: 1.0}
