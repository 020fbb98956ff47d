"""Helpers for running the docs' examples as a reader would: real processes, their output
in files, and waits on conditions with deadlines (never a bare sleep)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


def reader_environment(**variables: str) -> dict[str, str]:
    """The test's environment without KEYSHARD_* settings, the venv's commands first on the
    PATH (`keyshard`, `python`), plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **variables}


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def stop_like_ctrl_c(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGINT to the process group, as a terminal's Ctrl-C; its exit status (-9 if it had
    to be killed, which a test then reports as a failure)."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def create_topic_and_produce(
    bootstrap: str, topic: str, records: Mapping[str, list[str]]
) -> None:
    """A 1-partition topic with `records` (key -> values, in order)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, value.encode(), key=key.encode())
            for key, values in records.items()
            for value in values
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
