"""The per-key order check of the benchmarks (`harness.order_stats`) on hand-made logs."""

from harness import order_stats


def test_records_of_a_key_one_after_another_are_in_order() -> None:
    log = [[0, 0, 7, 0.0, 1.0], [0, 1, 7, 1.0, 2.0], [0, 2, 8, 0.0, 5.0]]
    stats = order_stats([log])
    assert (stats.handled, stats.violations, stats.redelivered) == (3, 0, 0)


def test_an_overlap_and_a_reversal_across_workers_are_violations() -> None:
    first = [[0, 0, 7, 0.0, 2.0], [0, 5, 9, 0.0, 1.0]]
    # offset 1 of key 7 starts before offset 0 ends; offset 6 of key 9 runs before offset 5
    second = [[0, 1, 7, 1.0, 3.0], [0, 6, 9, -2.0, -1.0]]
    stats = order_stats([first, second])
    assert (stats.violations, stats.keys_violated) == (2, 2)


def test_a_redelivered_record_counts_once_for_order() -> None:
    log = [[0, 0, 7, 0.0, 1.0], [0, 1, 7, 1.0, 2.0], [0, 0, 7, 5.0, 6.0]]
    stats = order_stats([log])
    assert (stats.handled, stats.violations, stats.redelivered) == (3, 0, 1)
