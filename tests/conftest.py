"""Shared fixtures. Keep this small; group fixtures by area when adding more."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from coordinator.broker import EmbeddedBroker


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
