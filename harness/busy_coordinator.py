"""`python -m harness.busy_coordinator <keyshard coordinator arguments>`: the coordinator
daemon, whose event loop SIGUSR1 holds for `KEYSHARD_BUSY_S` seconds (default 5), as a
registration storm can hold it: what tests of liveness under a busy loop send it.

A Python signal handler runs on the main thread, the one running the daemon's event loop,
so spinning in it stops every task of that loop, and nothing else: threads of their own
go on. It spins in Python bytecode rather than sleeping, as a storm's handlers keep the
CPU and the interpreter lock: another thread gets the lock only at the interpreter's
switch interval, as it would then.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from types import FrameType

from keyshard.cli.main import main

BUSY_ENV = "KEYSHARD_BUSY_S"
log = logging.getLogger(__name__)


def _hold_the_loop(_signum: int, _frame: FrameType | None) -> None:
    seconds = float(os.environ.get(BUSY_ENV, "5"))
    log.warning("holding the event loop for %g s (SIGUSR1)", seconds)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass
    log.warning("the event loop runs again")


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _hold_the_loop)
    sys.exit(main(["coordinator", *sys.argv[1:]]))
