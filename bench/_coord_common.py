"""Helpers shared by the coordinator benchmarks (handoff pause, coordinator scale).

Processes are started on free loopback ports and stopped by pid. CPU and memory of a
process are read from /proc (Linux), the same numbers `top` shows.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keyshard.local.processes import free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); honest for small samples."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Coordinator:
    """A real coordinator daemon process (`keyshard coordinator`)."""

    bootstrap: str
    log_path: Path
    extra: list[str] = field(default_factory=list)
    listen_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, log_level: str = "INFO") -> None:
        self.launch(log_level)
        self.wait_ready()

    def launch(self, log_level: str = "INFO") -> None:
        """Start the process without waiting (replicas start together: `wait_ready`)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "keyshard", "--log-level", log_level,
                    "coordinator", "--bootstrap-servers", self.bootstrap,
                    "--listen", self.address, "--admin-listen", f"127.0.0.1:{self.admin_port}",
                    *self.extra,
                ],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.admin_url}/readyz", timeout=5).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("coordinator did not become ready within 60 s")

    def group(self, group: str, timeout: float = 30) -> dict[str, Any] | None:
        response = httpx.get(f"{self.admin_url}/v1/groups/{group}", timeout=timeout)
        return response.json() if response.status_code == 200 else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def settled(view: Any, members: int) -> bool:
    """A group view with exactly `members` members, every slot running somewhere and no
    change pending (the same test as tests/integration/harness.is_settled)."""
    if view is None or len(view["members"]) != members:
        return False
    if view["quarantined"] or view["unowned"] or view["target_pending"]:
        return False
    return all(not m["draining"] and not m["starting"] for m in view["members"])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
