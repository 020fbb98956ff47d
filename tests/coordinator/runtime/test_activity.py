"""The activity line: what is reported, and that a quiet group stays quiet."""

from __future__ import annotations

from keyshard.coordinator.runtime.activity import Activity, LoopLag


def test_the_report_names_what_happened_and_then_starts_over() -> None:
    activity = Activity()
    activity.count("joined", 3)
    activity.timed("flush", 0.25)
    activity.timed("flush", 0.05)
    activity.lag(0.4)
    report = activity.take({"members": 3, "draining": 0})
    assert report == ("loop lag 400 ms; flush 2 (300 ms, longest 250 ms); joined 3; members 3"), (
        "zero gauges are left out"
    )
    assert activity.take({"members": 3}) is None, "nothing new: no line"
    assert activity.totals == {"joined": 3, "flush": 2}


def test_pings_of_a_healthy_group_are_not_news() -> None:
    activity = Activity()
    activity.timed("ping round trip", 0.002)
    activity.lag(0.01)
    assert activity.take() is None
    activity.timed("ping round trip", 0.9)
    activity.lag(0.5)
    assert activity.take() == "loop lag 500 ms; ping round trip 1 (900 ms, longest 900 ms)"


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
