"""Measured member speed (`coordinator.group.speed`): samples only from enough handler
time, and factors that ignore a wobble but weigh a member that is really slower."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keyshard.coordinator.group.speed import (
    DEAD_BAND,
    MIN_BUSY_S,
    SMOOTHING,
    SpeedMeter,
    speed_factors,
)


def test_no_speed_until_enough_was_measured() -> None:
    meter = SpeedMeter()
    meter.add(100, MIN_BUSY_S / 2)  # many records, too little handler time
    assert meter.speed is None
    meter.add(0, MIN_BUSY_S)  # enough time now: 100 records in 1.5 x MIN_BUSY_S
    assert meter.speed == 100 / (1.5 * MIN_BUSY_S)
    assert (meter.records, meter.busy_s) == (0, 0.0)


def test_few_records_make_no_sample() -> None:
    meter = SpeedMeter()
    meter.add(3, 10.0)  # three slow records: not enough to call the member slow
    assert meter.speed is None


def test_samples_are_smoothed() -> None:
    meter = SpeedMeter()
    meter.add(200, 1.0)
    meter.add(400, 1.0)
    assert meter.speed == 200 + SMOOTHING * (400 - 200)


def test_factors_need_two_measured_members() -> None:
    assert speed_factors({"a": (1, 50.0), "b": (1, None)}) == {"a": 1.0, "b": 1.0}


def test_a_wobble_is_no_difference() -> None:
    factors = speed_factors({"a": (1, 190.0), "b": (1, 200.0), "c": (1, 230.0)})
    assert factors == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_a_slow_member_is_weighed_at_its_speed() -> None:
    factors = speed_factors({"slow": (1, 50.0), "b": (1, 200.0), "c": (1, 210.0), "d": (1, None)})
    assert factors["slow"] == 50.0 / 200.0  # against the median of the measured, 200
    assert factors["b"] == factors["c"] == factors["d"] == 1.0  # d: not measured, typical


def test_speed_counts_per_unit_of_declared_capacity() -> None:
    # Declared twice the capacity and twice as fast: as declared.
    assert speed_factors({"a": (2, 400.0), "b": (1, 200.0)}) == {"a": 1.0, "b": 1.0}
    # Declared twice the capacity but no faster: weighed down to what it does.
    factors = speed_factors({"a": (2, 200.0), "b": (1, 200.0), "c": (1, 200.0)})
    assert factors == {"a": 0.5, "b": 1.0, "c": 1.0}


speeds = st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=2, max_size=12)


@given(speeds, st.floats(min_value=0.01, max_value=100.0))
def test_factors_are_relative(values: list[float], scale: float) -> None:
    """Only how members compare matters: the same group, all k times faster, is weighed
    the same, and each factor is either 1 or outside the dead band."""
    group = {f"m{i}": (1, v) for i, v in enumerate(values)}
    scaled = {mid: (1, v * scale) for mid, (_, v) in group.items()}
    factors = speed_factors(group)
    for mid, factor in speed_factors(scaled).items():
        assert abs(factor - factors[mid]) <= 1e-9 * max(1.0, factors[mid])
    for factor in factors.values():
        assert factor == 1.0 or not (1 / DEAD_BAND <= factor <= DEAD_BAND)
