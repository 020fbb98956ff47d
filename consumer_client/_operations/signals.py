"""SIGTERM and SIGINT for a consumer app: the first closes gracefully, a second aborts.

Kubernetes sends every pod SIGTERM on each rollout. Without a handler Python dies at
once, which to the group is a crash: the consumer's ranges wait out its session timeout
and the records it processed since its last report are processed again. `run()`
therefore installs handlers itself, but only where that takes nothing from the app: in
the main thread (signal handlers can only be set there), and for each signal only when
the app has no handler of its own for it. Python's defaults, asyncio's `Runner` SIGINT
handler (it only turns Ctrl-C into a cancellation) and an ignored signal are not the
app's: a shell starts a background job (`cmd &`) with SIGINT ignored, and that job still
wants a graceful SIGTERM. Each signal is judged on its own, so an app that handles Ctrl-C
itself still gets a graceful SIGTERM. A signal left alone is said in one INFO line.
`handle_signals=False` opts out; `keyshard worker`, which owns its process, takes both.

The first signal starts `close()` (stop dispatching, let in-flight records finish, Leave
with exact positions); a second one, for a drain that takes too long, aborts: `run()`
raises `ConsumerAborted` and nothing more is acknowledged (as after a crash, the next
owners start from the last reported positions).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keyshard.consumer_client._errors import ConsumerError

log = logging.getLogger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGINT)


class ConsumerAborted(ConsumerError):
    """A second SIGTERM/SIGINT came while the consumer was closing gracefully."""


class ShutdownState(enum.Enum):
    RUNNING = "running"
    CLOSING = "closing"  # the first signal came: draining, then Leave
    ABORTED = "aborted"  # the second came


def is_apps_own(sig: signal.Signals, handler: Any) -> bool:
    """Whether `handler` for `sig` is one the app installed itself (then `run()` leaves it
    alone): not Python's default, not asyncio's Ctrl-C handler, not an ignored signal."""
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    if sig == signal.SIGINT:
        if handler is signal.default_int_handler:
            return False
        # asyncio.run() installs partial(Runner._on_sigint, main_task=...): Ctrl-C
        # cancels the main task.
        method = handler.func if isinstance(handler, functools.partial) else handler
        return not isinstance(getattr(method, "__self__", None), asyncio.Runner)
    return True


@dataclass(frozen=True, slots=True)
class SignalChoice:
    """The signals `run()` takes over, and why it leaves each other one alone."""

    take: list[signal.Signals]
    left: dict[signal.Signals, str] = field(default_factory=dict)

    def explain(self) -> str | None:
        """One line about the signals left alone (None: every one is taken)."""
        if not self.left:
            return None
        reasons: dict[str, list[str]] = {}
        for sig, why in self.left.items():
            reasons.setdefault(why, []).append(sig.name)
        left = "; ".join(f"{' and '.join(names)}: {why}" for why, names in reasons.items())
        taken = " and ".join(sig.name for sig in self.take)
        after = f" ({taken} closes gracefully)" if taken else ""
        return f"not taking over {left}{after}"


def choose_signals(
    handlers: Mapping[signal.Signals, Any], *, main_thread: bool, wanted: bool = True
) -> SignalChoice:
    """Which of SIGTERM and SIGINT to take, given their current `handlers`."""
    if not wanted:
        return SignalChoice([], dict.fromkeys(HANDLED, "handle_signals=False"))
    if not main_thread:
        why = "run() is not in the main thread (close() or request_stop() stop gracefully)"
        return SignalChoice([], dict.fromkeys(HANDLED, why))
    take = [sig for sig in HANDLED if not is_apps_own(sig, handlers[sig])]
    left = {
        sig: f"the app handles it ({_describe(handlers[sig])})"
        for sig in HANDLED
        if sig not in take
    }
    return SignalChoice(take, left)


def signals_to_handle(wanted: bool = True) -> SignalChoice:
    """`choose_signals` for this thread and this process's handlers now."""
    return choose_signals(
        {sig: signal.getsignal(sig) for sig in HANDLED},
        main_thread=threading.current_thread() is threading.main_thread(),
        wanted=wanted,
    )


def _describe(handler: Any) -> str:
    function = handler.func if isinstance(handler, functools.partial) else handler
    return getattr(function, "__qualname__", None) or repr(function)


class GracefulSignals:
    """Installs the two handlers on a running loop and removes them again."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        close: Callable[[], None],
        abort: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._name = name
        self._close = close
        self._abort = abort
        self._installed: dict[signal.Signals, Any] = {}  # with the handler each replaced
        self.state = ShutdownState.RUNNING

    def install(self, signals: list[signal.Signals]) -> None:
        for sig in signals:
            previous = signal.getsignal(sig)
            try:
                self._loop.add_signal_handler(sig, self._received, sig)
            except (NotImplementedError, RuntimeError, ValueError) as err:
                # A loop without signal support (Windows' proactor, some embedded loops):
                # the app keeps Python's default and can still call close().
                log.debug("%s: cannot handle %s here: %s", self._name, sig.name, err)
                continue
            self._installed[sig] = previous

    def remove(self) -> None:
        """Our handlers off, what was there before back (an ignored signal stays ignored)."""
        for sig, previous in self._installed.items():
            self._loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
        self._installed.clear()

    def _received(self, sig: signal.Signals) -> None:
        if self.state is ShutdownState.RUNNING:
            self.state = ShutdownState.CLOSING
            log.warning(
                "%s: %s: closing gracefully (drain, then Leave); send it again to abort",
                self._name, sig.name,
            )  # fmt: skip
            self._close()
        elif self.state is ShutdownState.CLOSING:
            self.state = ShutdownState.ABORTED
            log.warning("%s: second %s: aborting without waiting for the drain", self._name,
                        sig.name)  # fmt: skip
            self._abort()
