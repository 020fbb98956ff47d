"""Child processes and ports for local runs: the demo, the tests and the benchmarks.

Everything local tooling starts is a real process on a free loopback port, stopped by
pid whatever happened to it meanwhile; these two helpers are that rule in code.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess

from keyshard.core.model.addresses import LOOPBACK

# Where the kernel picks the local ports of outgoing connections (Linux's default). A
# listening port taken from that range can be grabbed by any client socket (a broker's,
# aiokafka's) between the moment it is found free and the moment the child binds it, and
# the child then fails with "Address already in use".
_EPHEMERAL_DEFAULT = (32768, 60999)
_LISTEN_FLOOR = 10000
_TRIES = 200


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """Return a port that was free a moment ago, chosen at random below the ephemeral range.

    Below it, nothing but another listener can take the port before the child binds it,
    and the random choice keeps ports of consecutive calls (and of a restarted process's
    neighbours) apart. Where the range leaves no room, the kernel's choice (port 0)."""
    low, _high = _ephemeral_range()
    if low - _LISTEN_FLOOR >= 1000:
        for _ in range(_TRIES):
            port = random.randrange(_LISTEN_FLOOR, low)
            if _bindable(host, port):
                return port
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
