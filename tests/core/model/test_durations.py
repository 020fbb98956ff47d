"""The renaming rules every surface shares: a duration given by its old name (seconds) is
converted to its new one (milliseconds), and given under both names it is refused."""

from __future__ import annotations

import argparse

import pytest

from keyshard.core.model.durations import deprecated, pick_ms, take_renamed_flags

RENAMED = {"--wait-s": "--wait-ms", "--idle-seconds": "--idle-ms"}


def test_pick_ms_takes_either_name_and_converts_seconds() -> None:
    assert pick_ms(1500, None, new="a_ms", old="a_s") == 1500
    assert pick_ms(None, 0.25, new="a_ms", old="a_s") == 250
    assert pick_ms(None, None, new="a_ms", old="a_s") is None
    with pytest.raises(ValueError, match="a_ms and its deprecated name a_s are both given"):
        pick_ms(1500, 2, new="a_ms", old="a_s")


def test_old_flags_become_new_ones_with_a_line_each() -> None:
    args = argparse.Namespace(wait_s=1.5, wait_ms=None, idle_seconds=None, idle_ms=700)
    assert take_renamed_flags(args, RENAMED, lambda f: f"[{f}]") == [
        deprecated("[--wait-s]", "[--wait-ms]")
    ]
    assert vars(args) == {"wait_s": None, "wait_ms": 1500, "idle_seconds": None, "idle_ms": 700}


def test_a_flag_under_both_names_is_refused() -> None:
    args = argparse.Namespace(wait_s=None, wait_ms=None, idle_seconds=1.0, idle_ms=700)
    with pytest.raises(ValueError, match="--idle-ms and its deprecated name --idle-seconds"):
        take_renamed_flags(args, RENAMED)
