"""What the text of a flag (or of its KEYSHARD_* variable) means: each function turns it
into a value or raises an argparse error that names the value, which argparse prefixes
with the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from keyshard.coordinator.group.state import OffsetReset
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.model.addresses import parse_host_port

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_variable(flag: str) -> str:
    """The variable a flag reads: `--connect-timeout-ms` -> KEYSHARD_CONNECT_TIMEOUT_MS."""
    return "KEYSHARD_" + flag.lstrip("-").replace("-", "_").upper()


def host_port(value: str) -> tuple[str, int]:
    try:
        return parse_host_port(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT") from None


def servers(value: str) -> str:
    """A comma-separated list of HOST:PORT, each checked like --listen."""
    for part in value.split(","):
        host_port(part.strip())
    return value


def assignor(value: str) -> str:
    if value not in known_assignors():
        known = ", ".join(known_assignors())
        raise argparse.ArgumentTypeError(f"unknown assignor {value!r} (known: {known})")
    return value


def group_assignor(value: str) -> tuple[str, str]:
    group, sep, name = value.partition("=")
    if not sep or not group:
        raise argparse.ArgumentTypeError(f"{value!r} is not GROUP=ASSIGNOR")
    return group, assignor(name)


def number_above(floor: float) -> Callable[[str], float]:
    def number_above(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not number > floor:
            raise argparse.ArgumentTypeError(f"{value!r} must be > {floor:g}")
        return number

    return number_above


ratio = number_above(1.0)
positive_number = number_above(0.0)


def positive_ms(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a whole number of milliseconds"
        ) from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
    return number


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
    return number


def log_level(value: str) -> str:
    level = value.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def offset_reset(value: str) -> OffsetReset:
    try:
        return OffsetReset(value.lower())
    except ValueError:
        known = ", ".join(r.value for r in OffsetReset)
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {known}") from None


def group_offset_reset(value: str) -> tuple[str, OffsetReset]:
    group, sep, reset = value.partition("=")
    if not sep or not group:
        raise argparse.ArgumentTypeError(f"{value!r} is not GROUP=earliest or GROUP=latest")
    return group, offset_reset(reset)
