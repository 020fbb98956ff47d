"""Keyword arguments renamed to milliseconds, still accepted for one release.

Every duration the consumer library takes is in milliseconds, as Kafka's settings and the
`keyshard worker` flags are. An argument that was in seconds keeps its old name for one
release: passing it warns (`DeprecationWarning`, naming the new argument) and its value is
converted; passing both names is a `TypeError`, as passing one argument twice is.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def seconds_to_ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def renamed_seconds(**renames: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`@renamed_seconds(drain_timeout_s="drain_timeout_ms")`: the decorated function takes
    the new names only; a call with an old one is converted to the new one, in ms."""

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
