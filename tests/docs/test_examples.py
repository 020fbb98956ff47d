"""The README's consumer example, run as written against a real broker and coordinator:
only its two addresses are the fixtures' own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import CoordinatorProcess
from keyshard.local.broker import EmbeddedBroker
from tests.docs.blocks import examples_of
from tests.docs.running import create_topic_and_produce, kill_group, wait_until

KEYS = 10
PER_KEY = 5


@pytest.mark.integration
@pytest.mark.brokers("tansu")
async def test_the_readme_consumer_processes_every_record_in_key_order(
    broker: EmbeddedBroker, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    (block,) = examples_of("consumer-example")
    assert block.path.name == "README.md"
    code = block.code.replace("127.0.0.1:9092", broker.bootstrap_servers)
    code = code.replace("127.0.0.1:7171", coordinator.address)
    script = tmp_path / "consumer.py"
    script.write_text(code, encoding="utf-8")
    records = {f"customer-{k}": [f"order {k}.{i}" for i in range(PER_KEY)] for k in range(KEYS)}
    await create_topic_and_produce(broker.bootstrap_servers, "orders", records)

    out = tmp_path / "consumer.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def printed() -> list[str]:
        return [line for line in out.read_text().splitlines() if line.startswith("b'customer-")]

    try:
        await asyncio.to_thread(
            wait_until, lambda: len(printed()) >= KEYS * PER_KEY, 60, "every record printed"
        )
        os.kill(proc.pid, signal.SIGTERM)  # "until SIGTERM or Ctrl-C: drains, then leaves"
        status = await asyncio.to_thread(proc.wait, 30)
    finally:
        kill_group(proc)
    assert status == 0, out.read_text()[-3000:]
    seen: dict[str, list[str]] = {}
    for line in printed():
        key, value = line.split(" ", 1)
        seen.setdefault(key[2:-1], []).append(value[2:-1])
    assert seen == records  # each record once, each key's records in offset order
