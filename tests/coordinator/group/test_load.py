from __future__ import annotations

import math

import pytest

from keyshard.coordinator.group.load import BucketLoad
from keyshard.core.model.hashing import SLOT_COUNT


def test_a_steady_rate_is_estimated() -> None:
    load = BucketLoad(half_life_s=10)
    for second in range(200):  # 100 records/s into bucket 3, reported every second
        load.add([(3, 100)], at=float(second))
    assert load.rates(199.0)[3] == pytest.approx(100, rel=0.05)


def test_old_traffic_decays_by_half_life() -> None:
    load = BucketLoad(half_life_s=10)
    load.add([(1, 1000)], at=0.0)
    first = load.rates(0.0)[1]
    assert load.rates(10.0)[1] == pytest.approx(first / 2)
    assert load.rates(30.0)[1] == pytest.approx(first / 8)


def test_rebase_keeps_values_over_long_runs() -> None:
    """1000 s at a 1 s half-life crosses the rebase point ~14 times."""
    load = BucketLoad(half_life_s=1)
    for tick in range(10_000):  # one record every 0.1 s: 10 records/s
        load.add([(7, 1)], at=tick / 10)
    rate = load.rates(999.9)[7]
    assert math.isfinite(rate) and rate == pytest.approx(10, rel=0.1)


def test_slot_load_spreads_a_bucket_over_its_slots() -> None:
    load = BucketLoad(half_life_s=10)
    assert load.slot_load(0.0) is None
    load.add([(0, 160), (4095, 16)], at=0.0)
    slots = load.slot_load(0.0)
    assert slots is not None and len(slots) == SLOT_COUNT
    assert slots[0] == slots[15] == pytest.approx(load.rates(0.0)[0] / 16)
    assert slots[16] == 0.0
    assert slots[-1] == pytest.approx(load.rates(0.0)[4095] / 16)


def test_bad_buckets_and_counts_are_ignored() -> None:
    load = BucketLoad()
    load.add([(-1, 5), (4096, 5), (2, 0)], at=0.0)
    assert load.rates(0.0) == {}
    with pytest.raises(ValueError):
        BucketLoad(half_life_s=0)
