"""The limits a connection lives under: derived from the open-file limit, which the daemon
raises first; and asyncio's own accept failures (the admin API's) counted, not logged
with a traceback each."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import subprocess
import sys

import pytest

from keyshard.coordinator.server.admission import (
    ACCEPT_OUT_OF_RESOURCES,
    ConnectionCounts,
    ConnectionLimits,
    PendingRegisters,
    count_accept_errors,
    default_max_connections,
)


def test_the_default_cap_leaves_a_tenth_of_the_descriptors_free() -> None:
    assert default_max_connections(1024) == 922  # the limit a new user often has
    assert default_max_connections(256) == 192  # at least 64 kept
    assert default_max_connections(1 << 20) == 10_000
    assert default_max_connections(resource.RLIM_INFINITY) == 10_000


def test_counts_refuse_over_either_cap_and_free_on_close() -> None:
    counts = ConnectionCounts(ConnectionLimits(max_connections=3, max_connections_per_peer=2))
    for peer in ("a", "a", "b"):
        assert counts.refusal(peer) is None
        counts.add(peer)
    assert "--max-connections 3" in str(counts.refusal("c"))
    counts.remove("b")
    assert "--max-connections-per-peer 2" in str(counts.refusal("a"))
    assert counts.refusal("c") is None
    counts.remove("a")
    counts.remove("a")
    assert (counts.total, counts.of("a")) == (0, 0)


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    """In a child started at a soft limit of 256, as shells and container runtimes start
    processes below their hard limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here is {hard}")
    code = (
        "import json; from coordinator.server.admission import raise_open_file_limit as r; "
        "l = r(); print(json.dumps([l.before, l.soft, l.hard]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    before, soft, child_hard = json.loads(child.stdout)
    assert (before, child_hard) == (256, hard)
    assert soft == hard if hard != resource.RLIM_INFINITY else soft > 256


async def test_asyncio_accept_failures_are_counted_not_logged_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    others: list[str] = []
    loop.set_exception_handler(lambda _, context: others.append(context["message"]))
    restore = count_accept_errors(loop)
    with caplog.at_level(logging.WARNING, logger="keyshard.coordinator.server.admission"):
        for _ in range(500):  # what one wake-up of asyncio's accept loop reports
            loop.call_exception_handler(
                {"message": ACCEPT_OUT_OF_RESOURCES, "exception": OSError(errno.EMFILE, "x")}
            )
        loop.call_exception_handler({"message": "something else"})
        restore()
    assert others == ["something else"]  # everything else reaches the handler there was
    assert [r.getMessage() for r in caplog.records] == [
        "cannot accept admin API connections: [Errno 24] x",
        "... and 499 more accept errors of the admin API in the last 10 s",
    ]
    loop.call_exception_handler({"message": ACCEPT_OUT_OF_RESOURCES})
    assert others[-1] == ACCEPT_OUT_OF_RESOURCES  # restored
    loop.set_exception_handler(None)


def test_registers_in_flight_are_bounded_in_number() -> None:
    registers = PendingRegisters(limit=2, wait_limit_s=5.0)
    first, _ = registers.enter(0.0), registers.enter(0.0)
    refusal = registers.refusal(0.1)
    assert refusal is not None and "2 registrations in flight, as many as it takes" in refusal
    assert (registers.pending, registers.refused) == (2, 1), "a refusal counts nothing in"
    registers.leave(first)
    assert registers.refusal(0.1) is None
    with pytest.raises(ValueError, match="max_pending_registers must be >= 1"):
        ConnectionLimits(max_pending_registers=0)


def test_registers_are_refused_while_the_oldest_in_flight_waited_too_long() -> None:
    """Thousands in flight answered in time are no overload; one waiting past the limit
    is, until it is answered."""
    registers = PendingRegisters(limit=10_000, wait_limit_s=5.0)
    oldest = registers.enter(0.0)
    for _ in range(3_000):
        registers.enter(4.0)
    assert registers.refusal(4.9) is None
    refusal = registers.refusal(5.0)
    assert refusal is not None and "the oldest waiting 5.0 s" in refusal
    registers.leave(oldest)
    assert registers.refusal(5.0) is None, "the next oldest came at 4.0"
    assert registers.refusal(9.0) is not None
