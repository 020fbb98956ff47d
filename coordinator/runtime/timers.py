"""Keyed timers with an injectable clock.

Handlers only ever say "arm `SessionTimer("m1")` at t" or "cancel `DrainTimer("m1")`";
the runtime keys them by (group, key). Arming a key again replaces the previous deadline,
which is how session renewal works. The clock and the timers are injected, so tests of
the runtime can run without wall-clock time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
Clock = Callable[[], float]


class Timers(Protocol[K]):
    def set(self, key: K, at: float, callback: Callable[[K], None]) -> None: ...
    def cancel(self, key: K) -> None: ...
    def cancel_all(self) -> None: ...


class AsyncioTimers(Generic[K]):
    """Timers on the running loop; deadlines are in `clock` time (monotonic seconds)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._handles: dict[K, asyncio.TimerHandle] = {}

    def set(self, key: K, at: float, callback: Callable[[K], None]) -> None:
        self.cancel(key)
        delay = max(0.0, at - self._clock())

        def fire() -> None:
            self._handles.pop(key, None)
            callback(key)

        self._handles[key] = asyncio.get_running_loop().call_later(delay, fire)

    def cancel(self, key: K) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
