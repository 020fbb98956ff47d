"""Keyed timers with an injectable clock.

Handlers only ever say "arm `session:m1` at t" or "cancel `drain:m1`"; arming a key again
replaces the previous deadline, which is how session renewal works. Tests use `FakeClock`
and `ManualTimers` to move time by hand instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

Clock = Callable[[], float]
TimerCallback = Callable[[str], None]


class Timers(Protocol):
    def set(self, key: str, at: float, callback: TimerCallback) -> None: ...
    def cancel(self, key: str) -> None: ...
    def cancel_all(self) -> None: ...


class AsyncioTimers:
    """Timers on the running loop; deadlines are in `clock` time (monotonic seconds)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def set(self, key: str, at: float, callback: TimerCallback) -> None:
        self.cancel(key)
        delay = max(0.0, at - self._clock())

        def fire() -> None:
            self._handles.pop(key, None)
            callback(key)

        self._handles[key] = asyncio.get_running_loop().call_later(delay, fire)

    def cancel(self, key: str) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    def __contains__(self, key: str) -> bool:
        return key in self._handles


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class ManualTimers:
    """Timers fired by `advance()`, for deterministic tests of the runtime."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.armed: dict[str, tuple[float, TimerCallback]] = {}

    def set(self, key: str, at: float, callback: TimerCallback) -> None:
        self.armed[key] = (at, callback)

    def cancel(self, key: str) -> None:
        self.armed.pop(key, None)

    def cancel_all(self) -> None:
        self.armed.clear()

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        while True:
            due = sorted((at, k) for k, (at, _) in self.armed.items() if at <= self.clock.now)
            if not due:
                return
            _, key = due[0]
            _, callback = self.armed.pop(key)
            callback(key)
