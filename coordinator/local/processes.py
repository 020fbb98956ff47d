"""Child processes and ports for local runs: the demo, the tests and the benchmarks.

Everything local tooling starts is a real process on a free loopback port, stopped by
pid whatever happened to it meanwhile; these two helpers are that rule in code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess

from coordinator.model.addresses import LOOPBACK


def free_port(host: str = LOOPBACK) -> int:
    """Return a port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0
) -> None:
    """Stop a child by pid: `sig`, then SIGKILL if it is still there after `timeout`; reap.

    The demo, the tests and the benchmarks all start real processes and must leave none
    behind, whatever happened to them meanwhile (already gone is fine)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
