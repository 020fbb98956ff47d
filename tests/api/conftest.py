"""A real coordinator daemon with an admin token, and real consumer workers on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coordinator.broker import EmbeddedBroker
from tests.integration.harness import CoordinatorProcess, Workers

ADMIN_TOKEN = "admin-test-token"


@pytest.fixture
async def daemon(broker: EmbeddedBroker, tmp_path: Path) -> AsyncIterator[CoordinatorProcess]:
    coord = CoordinatorProcess(
        broker.bootstrap_servers,
        tmp_path,
        extra=["--drain-timeout-ms", "2000", "--admin-token", ADMIN_TOKEN],
    )
    try:
        await coord.start()
        yield coord
    finally:
        coord.stop()


@pytest.fixture
def consumers(daemon: CoordinatorProcess, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(daemon, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()
