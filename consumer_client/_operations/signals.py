"""SIGTERM and SIGINT for a consumer app: the first closes gracefully, a second aborts.

Kubernetes sends every pod SIGTERM on each rollout. Without a handler Python dies at
once, which to the group is a crash: the consumer's ranges wait out its session timeout
and the records it processed since its last report are processed again. `run()`
therefore installs handlers itself, but only where that cannot take anything from the
app: in the main thread (signal handlers can only be set there) and when nobody installed
a handler of their own (asyncio's `Runner` SIGINT handler counts as the default: it only
turns Ctrl-C into a cancellation). `handle_signals=False` opts out.

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
from collections.abc import Callable
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


def _is_default(sig: signal.Signals, handler: Any) -> bool:
    """Nobody but Python or asyncio set this handler: ours takes nothing from the app."""
    if handler in (signal.SIG_DFL, None):
        return True
    if sig == signal.SIGINT:
        if handler is signal.default_int_handler:
            return True
        # asyncio.run() installs partial(Runner._on_sigint, main_task=...): Ctrl-C
        # cancels the main task.
        method = handler.func if isinstance(handler, functools.partial) else handler
        return isinstance(getattr(method, "__self__", None), asyncio.Runner)
    return False


def signals_to_handle() -> list[signal.Signals]:
    """The signals `run()` may take over here: none outside the main thread, and none
    that has a handler of the app's own. An app that handles one of the two itself
    handles its shutdown itself: then neither is taken."""
    if threading.current_thread() is not threading.main_thread():
        return []
    if all(_is_default(sig, signal.getsignal(sig)) for sig in HANDLED):
        return list(HANDLED)
    return []


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
        self._installed: list[signal.Signals] = []
        self.state = ShutdownState.RUNNING

    def install(self, signals: list[signal.Signals]) -> None:
        for sig in signals:
            try:
                self._loop.add_signal_handler(sig, self._received, sig)
            except (NotImplementedError, RuntimeError, ValueError) as err:
                # A loop without signal support (Windows' proactor, some embedded loops):
                # the app keeps Python's default and can still call close().
                log.debug("%s: cannot handle %s here: %s", self._name, sig.name, err)
                continue
            self._installed.append(sig)

    def remove(self) -> None:
        for sig in self._installed:
            self._loop.remove_signal_handler(sig)
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
