"""Shared fixtures. Keep this small; group fixtures by area when adding more."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.broker import EmbeddedBroker

REPO_ROOT = Path(__file__).resolve().parent.parent


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


@pytest.fixture(scope="session")
def broker_session() -> Iterator[EmbeddedBroker]:
    """One broker shared by the whole session: use unique topic/group names per test."""
    b = EmbeddedBroker()
    try:
        b.start()
        yield b
    finally:
        _stop_broker(b)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """``<repo>/test-artifacts`` (git-ignored), for logs and reports worth keeping."""
    path = REPO_ROOT / "test-artifacts"
    path.mkdir(exist_ok=True)
    return path
