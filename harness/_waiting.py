"""Waiting on a condition with a deadline: the one way tests and benchmarks wait.

A bare sleep either wastes time or hopes; polling a probe until it answers, and failing
with what was awaited and what the probe said last, does neither.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


# Two signatures so a coroutine probe's result type survives (one union of `Awaitable[T] | T`
# infers T as Never for coroutine functions). Only a truthy result is returned, so a probe
# that answers `X | None` gives an `X`.
@overload
async def wait_for(
    probe: Callable[[], Awaitable[T | None]], timeout: float, what: str, interval: float = 0.05
) -> T: ...


@overload
async def wait_for(
    probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T: ...


async def wait_for(
    probe: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll `probe` until it returns something truthy; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        result = probe()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        last = result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)
