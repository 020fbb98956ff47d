"""Every example in the docs is either run by a test or says why it is not."""

from __future__ import annotations

from tests.docs.blocks import examples, examples_of

#: The tests that run marked blocks, each in its own module of tests/docs.
RUNNERS = {"consumer-example", "walkthrough"}


def test_every_example_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in examples() if b.marker is None]
    assert unmarked == [], "mark these blocks <!-- test: NAME --> or <!-- test: skip, WHY -->"


def test_a_skipped_example_gives_its_reason() -> None:
    bare = [b.where for b in examples() if b.marker is not None and b.marker.strip() == "skip"]
    assert bare == []


def test_every_named_test_exists_and_runs_something() -> None:
    named = {b.test for b in examples() if b.test is not None}
    assert named == RUNNERS
    for runner in RUNNERS:
        assert examples_of(runner), runner
