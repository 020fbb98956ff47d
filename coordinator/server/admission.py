"""Who may hold a connection to the consumer channel, and for how long.

A connection costs the coordinator a file descriptor until it is closed. Left open, 1,100
idle connections to a coordinator with the common 1,024 open-file limit leave it unable to
accept anyone (its own Kafka clients included), and asyncio logs a traceback for every
failed accept. So:

* a connection must register within `register_timeout_ms` of being accepted (a TLS
  handshake and Metadata requests count against it, they do not extend it);
* at most `max_connections` connections at once, and `max_connections_per_peer` from one
  address; a connection over either cap is refused with a `TOO_MANY_CONNECTIONS` error
  naming the cap, then closed;
* the default cap is derived from the open-file limit, which the daemon first raises to
  its hard limit, so the listener alone can never exhaust the descriptors;
* Registers in flight (received, not answered yet) are bounded in number
  (`max_pending_registers`) and in how long the oldest of them has waited
  (`REGISTER_WAIT_LIMIT_S`): past either, one more is refused at once with
  `TOO_MANY_CONNECTIONS` (correlation id 0, then a close), which every client retries
  with its usual backoff, instead of waiting in the event loop's queue past its own
  timeout while holding the loop up for everyone. The wait is what says the replica is
  behind: a storm it serves in time is not refused at all (a refusal, the client's
  lookup and its new connection cost more than the Register would have), and one it
  cannot is taken at the pace the oldest Registers are answered;
* until it registers, a connection may send frames of at most
  `pre_auth_max_frame_bytes` (a Register fits; the normal limit applies once it is
  registered), so a thousand connections that each start a huge frame cost the
  coordinator a thousand small buffers, not a thousand large ones;
* what a flood produces in the log is a few lines per interval with counts
  (`ThrottledLog`), never a line per connection.

Nothing here does I/O: the listener (`coordinator.server.listener`) applies it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keyshard.core.protocol.codec import PRE_AUTH_MAX_FRAME_BYTES
from keyshard.core.security.log_safety import ThrottledLog

log = logging.getLogger(__name__)

DEFAULT_REGISTER_TIMEOUT_MS = 10_000
DEFAULT_MAX_CONNECTIONS = 10_000  # when the open-file limit allows it
DEFAULT_MAX_CONNECTIONS_PER_PEER = 1_000
# Registers in flight: every one waits for a fresh partition count from Kafka (topics
# created meanwhile must be seen), so a storm has thousands in flight at once for a round
# trip and that is no overload; the bound is for memory, the wait below for pace.
DEFAULT_MAX_PENDING_REGISTERS = 5_000
# Half the reference client's 10 s Register timeout (consumer_client REGISTER_TIMEOUT_S):
# a Register admitted behind one that waited this long may well be answered too late.
REGISTER_WAIT_LIMIT_S = 5.0
# Descriptors kept free of consumer connections: Kafka clients, the admin API, log files.
FD_RESERVE_FRACTION = 0.1
FD_RESERVE_MIN = 64
# The smallest pre-authentication frame limit: a Register without a claim fits with room.
MIN_PRE_AUTH_FRAME_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    register_timeout_ms: int = DEFAULT_REGISTER_TIMEOUT_MS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    pre_auth_max_frame_bytes: int = PRE_AUTH_MAX_FRAME_BYTES
    max_pending_registers: int = DEFAULT_MAX_PENDING_REGISTERS
    # The open-file limit they were derived from, for the start-up log line.
    open_files: str = ""

    def describe(self) -> str:
        """The line the daemon logs once it serves: logged earlier, it would stand above
        the one line of a refusal to start (a wrong password, say) and blur it."""
        return (
            f"open-file limit: {self.open_files}; consumer connections: at most "
            f"{self.max_connections}, {self.max_connections_per_peer} per address, "
            f"{self.register_timeout_ms} ms to register, frames of at most "
            f"{self.pre_auth_max_frame_bytes} bytes until then"
        )

    def __post_init__(self) -> None:
        for name in (
            "register_timeout_ms", "max_connections", "max_connections_per_peer",
            "max_pending_registers",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pre_auth_max_frame_bytes < MIN_PRE_AUTH_FRAME_BYTES:
            raise ValueError(
                f"pre_auth_max_frame_bytes must be >= {MIN_PRE_AUTH_FRAME_BYTES}, "
                f"got {self.pre_auth_max_frame_bytes}"
            )


class ConnectionCounts:
    """Open connections, in total and per peer address."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self._per_peer: Counter[str] = Counter()

    def refusal(self, peer: str) -> str | None:
        """Why a new connection from `peer` must be refused, or None to admit it."""
        if self.total >= self.limits.max_connections:
            return (
                f"the coordinator has {self.total} connections open, its limit "
                f"(--max-connections {self.limits.max_connections}); try again later"
            )
        held = self._per_peer[peer]
        if held >= self.limits.max_connections_per_peer:
            return (
                f"{peer} has {held} connections open to the coordinator, the limit per "
                f"address (--max-connections-per-peer {self.limits.max_connections_per_peer})"
            )
        return None

    def add(self, peer: str) -> None:
        self.total += 1
        self._per_peer[peer] += 1

    def remove(self, peer: str) -> None:
        self.total -= 1
        self._per_peer[peer] -= 1
        if self._per_peer[peer] <= 0:
            del self._per_peer[peer]

    def of(self, peer: str) -> int:
        return self._per_peer[peer]


class PendingRegisters:
    """Registers in flight, bounded in number and in the wait of the oldest (the module
    docstring). Times are the caller's monotonic clock."""

    def __init__(self, limit: int, wait_limit_s: float = REGISTER_WAIT_LIMIT_S) -> None:
        self.limit = limit
        self.wait_limit_s = wait_limit_s
        self.refused = 0  # since start
        self._since: dict[int, float] = {}  # in the order they came
        self._ids = itertools.count()

    @property
    def pending(self) -> int:
        return len(self._since)

    def refusal(self, now: float) -> str | None:
        """Why a Register arriving at `now` must be refused (counted), or None."""
        oldest = next(iter(self._since.values()), now)
        if self.pending >= self.limit:
            why = f"as many as it takes at once ({self.limit})"
        elif now - oldest >= self.wait_limit_s:
            why = f"the oldest waiting {now - oldest:.1f} s"
        else:
            return None
        self.refused += 1
        return (
            f"the coordinator has {self.pending} registrations in flight, {why}; try again shortly"
        )

    def enter(self, now: float) -> int:
        """Count in a Register admitted at `now`; `leave` it with the ticket returned."""
        ticket = next(self._ids)
        self._since[ticket] = now
        return ticket

    def leave(self, ticket: int) -> None:
        """The Register is answered (or failed)."""
        self._since.pop(ticket, None)


# ---- the open-file limit ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenFileLimit:
    before: int  # the soft limit the process started with
    soft: int  # the soft limit now
    hard: int


def raise_open_file_limit() -> OpenFileLimit:
    """Raise the soft RLIMIT_NOFILE to the hard limit (an unprivileged process may).

    Shells and container runtimes commonly start processes at a soft limit of 1,024,
    far below the hard limit; the coordinator holds one descriptor per consumer. An
    unlimited hard limit is not a valid soft limit on Linux (it is capped by
    fs.nr_open), so then the largest value the kernel accepts is tried.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if before in (hard, resource.RLIM_INFINITY):
        return OpenFileLimit(before=before, soft=before, hard=hard)
    targets = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 1 << 16]
    for target in targets:
        if target <= before:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        return OpenFileLimit(before=before, soft=target, hard=hard)
    return OpenFileLimit(before=before, soft=before, hard=hard)


def fitting_max_connections(soft_limit: int) -> int:
    """The most consumer connections that leave a reserve of descriptors free."""
    if soft_limit == resource.RLIM_INFINITY:
        return 1 << 31
    reserve = max(FD_RESERVE_MIN, int(soft_limit * FD_RESERVE_FRACTION))
    return max(1, soft_limit - reserve)


def default_max_connections(soft_limit: int) -> int:
    """`--max-connections` when not given: 10,000, or fewer to fit the open-file limit."""
    return min(DEFAULT_MAX_CONNECTIONS, fitting_max_connections(soft_limit))


def connection_limits(
    register_timeout_ms: int | None = None,
    max_connections: int | None = None,
    max_connections_per_peer: int | None = None,
    pre_auth_max_frame_bytes: int | None = None,
) -> ConnectionLimits:
    """The limits in force, each None taking its default. Raises the open-file limit
    first (the default cap is derived from it); warns at once of a cap it cannot hold."""
    nofile = raise_open_file_limit()
    fitting = fitting_max_connections(nofile.soft)
    defaults = ConnectionLimits()
    limits = ConnectionLimits(
        register_timeout_ms=register_timeout_ms or defaults.register_timeout_ms,
        max_connections=max_connections or default_max_connections(nofile.soft),
        max_connections_per_peer=max_connections_per_peer or defaults.max_connections_per_peer,
        pre_auth_max_frame_bytes=pre_auth_max_frame_bytes or defaults.pre_auth_max_frame_bytes,
        open_files=(
            f"soft {_limit(nofile.soft)} (was {_limit(nofile.before)}), hard {_limit(nofile.hard)}"
        ),
    )
    if limits.max_connections > fitting:
        log.warning(
            "--max-connections %d is more than the open-file limit %s leaves room for "
            "(%d): a flood can use up the descriptors before the cap refuses anyone",
            limits.max_connections, _limit(nofile.soft), fitting,
        )  # fmt: skip
    return limits


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"  # asyncio's message


def count_accept_errors(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Route asyncio's own accept failures (the admin API listens through asyncio's
    accept loop) to a `ThrottledLog` instead of a traceback per attempt; every other
    context goes to the handler that was there. Returns what puts that handler back."""
    throttled = ThrottledLog(log, "accept errors of the admin API", burst=1)
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_OUT_OF_RESOURCES:
            throttled("cannot accept admin API connections: %s", context.get("exception"))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)

    def restore() -> None:
        throttled.flush()
        loop.set_exception_handler(previous)

    return restore
