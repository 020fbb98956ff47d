"""The activity line: what is reported, and that a quiet group stays quiet."""

from __future__ import annotations

from keyshard.coordinator.runtime.activity import Activity


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
