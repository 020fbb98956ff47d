"""The benchmarks' statistics: nearest-rank percentiles, and no answer but NaN for no
samples (a missing measure must not read as a measured 0)."""

import math

from harness import median, percentile


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([5.0, 1.0, 3.0]) == 3.0


def test_a_percentile_is_a_value_that_occurred() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([7.0, 1.0, 9.0], 50) == 7.0
    assert percentile([7.0], 0) == 7.0


def test_no_samples_have_no_median_and_no_percentile() -> None:
    assert math.isnan(median([]))
    assert math.isnan(percentile([], 99))
