"""Shared fixtures. Keep this small; group fixtures by area when adding more."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from coordinator.local.broker import EmbeddedBroker
from tests.integration.harness import CoordinatorProcess, Workers

# CI explores a fixed sequence of examples (a red CI then means a change broke something,
# not that chance found an old case); local runs keep exploring at random.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _stop_broker(broker: EmbeddedBroker) -> None:
    """Stop politely, and if anything goes wrong make sure the pid is gone anyway."""
    pid = broker.pid
    try:
        broker.stop()
    finally:
        if pid is not None and broker.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            broker.kill()  # reaps


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """A fresh in-memory Tansu broker on a free port, stopped after the test."""
    b = EmbeddedBroker()
    try:
        b.start()
        yield b
    finally:
        _stop_broker(b)


@pytest.fixture
async def coordinator(
    broker: EmbeddedBroker, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[CoordinatorProcess]:
    """A coordinator daemon process on the test's broker, with a 2 s drain deadline and
    any extra flags from `@pytest.mark.coordinator_args(...)`."""
    marker = request.node.get_closest_marker("coordinator_args")
    extra = ["--drain-timeout-ms", "2000", *(marker.args if marker else ())]
    coord = CoordinatorProcess(broker.bootstrap_servers, tmp_path, extra=extra)
    try:
        await coord.start()
        yield coord
    finally:
        coord.stop()


@pytest.fixture
def workers(coordinator: CoordinatorProcess, tmp_path: Path) -> Iterator[Workers]:
    """Consumer worker processes on `coordinator`, all stopped (by pid) afterwards."""
    w = Workers(coordinator, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()
