"""Durations in milliseconds, and the names that were in seconds, still taken for one release.

Every duration a user gives keyshard is in milliseconds, as Kafka's settings are: the
consumer library's arguments, the `keyshard worker` flags, the Spark job's flags and the
Spark source's options. A knob that was in seconds keeps its old name for one release:
given, it warns (naming the new name) and its value is converted; given together with its
new name, it is an error, as giving one argument twice is. Each surface warns its own way
(a `DeprecationWarning` for a Python call, one line on stderr for a flag), so the rules
are here and the wording of the warning is `deprecated`.
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def seconds_to_ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def deprecated(old: str, new: str) -> str:
    """What a warning about an old name says."""
    return f"{old} is deprecated: use {new}, in milliseconds"


def pick_ms(ms: int | None, seconds: float | None, *, new: str, old: str) -> int | None:
    """The duration given by its name in milliseconds (`new`) or by its deprecated name in
    seconds (`old`), in milliseconds; both given is a `ValueError` naming the two."""
    if seconds is None:
        return ms
    if ms is not None:
        raise ValueError(f"{new} and its deprecated name {old} are both given: give only {new}")
    return seconds_to_ms(seconds)


def take_renamed_flags(
    args: argparse.Namespace,
    renamed: Mapping[str, str],
    shown: Callable[[str], str] = str,
) -> list[str]:
    """A command line's flags in seconds renamed to milliseconds (`renamed`: old flag ->
    new flag, both parsed): each old one given becomes its new one, in ms. Returns the
    warnings to print, a line each; a setting given under both names is a `ValueError`.
    `shown` names a flag in those lines (with its environment variable, say)."""
    lines: list[str] = []
    for old, new in renamed.items():
        old_dest, new_dest = _dest(old), _dest(new)
        seconds = getattr(args, old_dest)
        if seconds is None:
            continue
        ms = pick_ms(getattr(args, new_dest), seconds, new=shown(new), old=shown(old))
        setattr(args, new_dest, ms)
        setattr(args, old_dest, None)
        lines.append(deprecated(shown(old), shown(new)))
    return lines


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def renamed_seconds(**renames: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`@renamed_seconds(drain_timeout_s="drain_timeout_ms")`: the decorated function takes
    the new names only; a call with an old one warns (`DeprecationWarning`, pointing at the
    caller) and is converted to the new one, in ms; a call with both is a `TypeError`."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        owner = function.__qualname__.removesuffix(".__init__")

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{owner}() got both {new} and its old name {old}")
                warnings.warn(
                    f"{owner}({old}=...) is deprecated: pass {new} (milliseconds)",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = seconds_to_ms(kwargs.pop(old))
            return function(*args, **kwargs)

        return call

    return decorate
