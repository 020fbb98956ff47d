"""docs/user-guide/getting-started.md, run as written: its blocks in order, in a fresh
folder, the way a reader runs them in terminals.

What differs from a reader's machine is only where things listen: the documented
addresses (the broker's 127.0.0.1:9092, the coordinator's default 127.0.0.1:7171 and
:7172) are moved to free ports, the broker's in the text and the coordinator's by the
KEYSHARD_* variables every command reads, so the commands themselves stay as written.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from keyshard.local.processes import free_port
from tests.docs.blocks import Block, examples_of
from tests.docs.running import kill_group, reader_environment, stop_like_ctrl_c, wait_until

RECORDS = 100  # what produce.py sends
_HANDLED = re.compile(r"^(customer-\d+): order (\d+) \(offset (\d+)\)$")


def handled(log: Path) -> list[tuple[str, int, int]]:
    """(key, order number, offset) of every record the handler printed."""
    rows = []
    for line in log.read_text(errors="replace").splitlines():
        if m := _HANDLED.match(line):
            rows.append((m[1], int(m[2]), int(m[3])))
    return rows


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    blocks = examples_of("walkthrough")
    assert [b.path.name for b in blocks] == ["getting-started.md"] * len(blocks)
    broker = f"127.0.0.1:{free_port()}"
    listen, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = reader_environment(
        KEYSHARD_LISTEN=listen,
        KEYSHARD_ADMIN_LISTEN=admin,
        KEYSHARD_COORDINATOR=listen,
        KEYSHARD_ADMIN=f"http://{admin}",
    )
    logs = tmp_path / "terminals"
    logs.mkdir()
    # When a background command is ready for the next step, as a reader sees it.
    ready: dict[str, Callable[[Path], bool]] = {
        "coordinator": lambda log: "listening on" in log.read_text(errors="replace"),
        "worker": lambda log: len(handled(log)) >= RECORDS,
    }
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for block in blocks:
            _step(block, broker, tmp_path, logs, env, ready, running)
        assert set(running) == set(ready)
        # Step 7: Ctrl-C the worker (a graceful leave, status 0), then the coordinator.
        assert stop_like_ctrl_c(running["worker"], 60) == 0, _tail(logs / "worker.log")
        assert stop_like_ctrl_c(running["coordinator"], 60) == 0, _tail(logs / "coordinator.log")
    finally:
        for proc in running.values():
            kill_group(proc)
    rows = handled(logs / "worker.log")
    assert sorted(n for _, n, _ in rows) == list(range(RECORDS))  # each record once
    by_key: dict[str, list[int]] = {}
    for key, _, offset in rows:
        by_key.setdefault(key, []).append(offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())


def _step(
    block: Block,
    broker: str,
    folder: Path,
    logs: Path,
    env: dict[str, str],
    ready: dict[str, Callable[[Path], bool]],
    running: dict[str, subprocess.Popen[bytes]],
) -> None:
    code = block.code.replace("127.0.0.1:9092", broker)
    if (name := block.option("file")) is not None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code, encoding="utf-8")
        return
    if (name := block.option("background")) is not None:
        log = logs / f"{name}.log"
        with log.open("wb") as sink:
            running[name] = subprocess.Popen(
                ["bash", "-c", code], cwd=folder, env=env, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_until(
            lambda: ready[name](log) or running[name].poll() is not None, 90, f"{name} ready"
        )
        assert running[name].poll() is None, f"{block.where}: {name} exited\n{_tail(log)}"
        return
    done = subprocess.run(
        ["bash", "-e", "-c", code], cwd=folder, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}\n{done.stderr}"


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
