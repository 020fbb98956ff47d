from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coordinator.broker import EmbeddedBroker
from tests.integration.harness import CoordinatorProcess, Workers


@pytest.fixture
async def coordinator(broker: EmbeddedBroker, tmp_path: Path) -> AsyncIterator[CoordinatorProcess]:
    """A coordinator daemon process on the test's broker (short drain deadline)."""
    coord = CoordinatorProcess(
        broker.bootstrap_servers, tmp_path, extra=["--drain-timeout-ms", "2000"]
    )
    try:
        await coord.start()
        yield coord
    finally:
        coord.stop()


@pytest.fixture
def workers(coordinator: CoordinatorProcess, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(coordinator, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()
