"""The activity line: what is reported, and that a quiet group stays quiet."""

from __future__ import annotations

from keyshard.coordinator.runtime.activity import SAMPLES, Activity, LoopLag, Timing


def test_the_report_names_what_happened_and_then_starts_over() -> None:
    activity = Activity()
    activity.count("joined", 3)
    activity.timed("flush", 0.25)
    activity.timed("flush", 0.05)
    activity.lag(0.4)
    report = activity.take({"members": 3, "draining": 0})
    assert report == (
        "loop lag 400 ms; flush 2 (300 ms, p50 50 ms, p99 250 ms, longest 250 ms); joined 3; "
        "members 3"
    ), "zero gauges are left out"
    assert activity.take({"members": 3}) is None, "nothing new: no line"
    assert activity.totals == {"joined": 3, "flush": 2}


def test_pings_of_a_healthy_group_are_not_news() -> None:
    activity = Activity()
    activity.timed("ping round trip", 0.002)
    activity.lag(0.01)
    assert activity.take() is None
    activity.timed("ping round trip", 0.9)
    activity.lag(0.5)
    assert activity.take() == (
        "loop lag 500 ms; ping round trip 1 (900 ms, p50 900 ms, p99 900 ms, longest 900 ms)"
    )


def test_percentiles_come_from_a_bounded_uniform_sample() -> None:
    timing = Timing()
    for ms in range(1, 101):
        timing.add(ms / 1000)
    assert (timing.percentile(0.5), timing.percentile(0.99)) == (0.05, 0.099)
    for _ in range(3 * SAMPLES):
        timing.add(1.0)
    assert len(timing.samples) == SAMPLES, "bounded however many came"
    assert timing.percentile(0.5) == 1.0 and timing.count == 100 + 3 * SAMPLES
    assert timing.longest == 1.0


def test_histograms_count_every_duration_since_start() -> None:
    activity = Activity()
    for seconds in (0.001, 0.005, 0.006, 20.0):
        activity.timed("flush", seconds)
    activity.take()
    buckets = dict(activity.histograms["flush"].cumulative())
    assert (buckets["0.005"], buckets["0.01"], buckets["10.0"], buckets["+Inf"]) == (2, 3, 3, 4)


def test_the_loop_lag_of_the_last_window_is_kept_past_the_report() -> None:
    """The metric and readiness see the longest lag of the last ten seconds, whatever the
    activity line took meanwhile; jitter below 50 ms is not kept."""
    lag = LoopLag(window_s=10.0)
    lag.add(100.0, 0.01)
    assert lag.longest(100.0) == 0.0
    lag.add(101.0, 2.5)
    lag.add(105.0, 0.3)
    assert lag.longest(110.9) == 2.5
    assert lag.longest(111.1) == 0.3, "the 2.5 s lag is older than the window"
    assert lag.longest(115.1) == 0.0
