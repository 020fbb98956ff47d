"""`keyshard coordinator` with no Kafka named starts the embedded broker, on the port
`--embedded-broker-listen` gives: its start-up line says where, and that the data is in
memory. Records produced there reach a consumer of the coordinator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import create_topic, produce, wait_for
from keyshard.local.processes import free_port, stop_process
from keyshard.local.verify import read_processed

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_the_embedded_broker_listens_where_it_is_told(tmp_path: Path) -> None:
    kafka, listen, admin = (f"127.0.0.1:{free_port()}" for _ in range(3))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    out = tmp_path / "coordinator.out"
    with open(out, "wb") as log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "keyshard", "coordinator", "--listen", listen,
             "--admin-listen", admin],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            env={**env, "KEYSHARD_EMBEDDED_BROKER_LISTEN": kafka},
        )  # fmt: skip
    worker = None
    try:
        announced = (
            f"keyshard coordinator listening on {listen}, admin http://{admin}, "
            f"kafka {kafka} (embedded broker: data in memory, lost on exit)"
        )
        await wait_for(lambda: announced in out.read_text(), 60, "the start-up line")
        await create_topic(kafka, "orders")
        produced = await produce(kafka, 50, 10, topic="orders")
        done = tmp_path / "w.jsonl"
        worker = subprocess.Popen(
            [sys.executable, "-m", "keyshard", "worker", "tests.integration.worker_app:handle",
             "--group", "g", "--topics", "orders", "--coordinator", listen,
             "--bootstrap-servers", kafka],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**env, "KEYSHARD_TEST_OUT": str(done)},
        )  # fmt: skip
        expected = {(r.partition, r.offset) for r in produced}
        await wait_for(
            lambda: {(e.partition, e.offset) for e in read_processed([done])} == expected,
            60, "every record processed",
        )  # fmt: skip
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(coordinator)
