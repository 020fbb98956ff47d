"""`keyshard coordinator`'s bounds on what one member may ask for and report
(coordinator.group.bounds): each a flag, its KEYSHARD_* variable, a Helm value."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from keyshard.cli.flag_values import positive_int, positive_ms, ratio
from keyshard.coordinator.group.bounds import Bounds

BOUNDS = Bounds()


def add_bound_flags(coord: argparse.ArgumentParser, add: Callable[..., None]) -> None:
    """`add` is the parser's flag adder (keyshard.cli.parser._add: it reads the variable)."""
    add(
        coord,
        "--max-capacity",
        type=positive_int,
        default=BOUNDS.max_capacity,
        help="a member's declared capacity counts at most this (more is capped): one "
        "consumer cannot claim nearly every slot",
    )
    add(
        coord,
        "--min-session-timeout-ms",
        type=positive_ms,
        default=BOUNDS.min_session_timeout_ms,
        help="a Register with a shorter session timeout is refused (Kafka's "
        "group.min.session.timeout.ms)",
    )
    add(
        coord,
        "--max-session-timeout-ms",
        type=positive_ms,
        default=BOUNDS.max_session_timeout_ms,
        help="a Register with a longer session timeout is refused: the longest a vanished "
        "member's slots wait (Kafka's group.max.session.timeout.ms)",
    )
    add(
        coord,
        "--max-members-per-group",
        type=positive_int,
        default=BOUNDS.max_members_per_group,
        help="members of one group; one more is refused (Kafka's group.max.size)",
    )
    add(
        coord,
        "--max-groups",
        type=positive_int,
        default=BOUNDS.max_groups,
        help="groups one replica serves; a Register that would create one more is refused",
    )
    add(
        coord,
        "--max-speed-factor",
        type=ratio,
        default=BOUNDS.max_speed_factor,
        help="load-aware: a member's measured speed counts within this factor of the "
        "group's median, either way",
    )


def bounds_from(args: argparse.Namespace) -> Bounds:
    """The parsed flags as bounds; ValueError when they contradict each other."""
    return Bounds(
        max_capacity=int(args.max_capacity),
        min_session_timeout_ms=int(args.min_session_timeout_ms),
        max_session_timeout_ms=int(args.max_session_timeout_ms),
        max_members_per_group=int(args.max_members_per_group),
        max_groups=int(args.max_groups),
        max_speed_factor=float(args.max_speed_factor),
    )
