"""Real processes for tests and benchmarks: coordinator daemons (one, or replicas on one
state topic) and consumer workers.

Everything is started on free loopback ports and stopped by pid, whatever the outcome
(`keyshard.local.processes`, which the demo uses too). Waiting is always on a condition
with a deadline (`wait_for`), never a bare sleep. CPU and memory of a process are read from
/proc (Linux), the same numbers `top` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness._groups import is_settled
from harness._waiting import wait_for
from keyshard.local.demo import GROUP, TOPIC, worker_command
from keyshard.local.processes import free_port, stop_process
from keyshard.local.verify import Processed, read_processed

CLK_TCK = os.sysconf("SC_CLK_TCK")
# A coordinator whose event loop SIGUSR1 holds (`harness.busy_coordinator`).
BUSY_COORDINATOR = ("-m", "harness.busy_coordinator")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` now, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class CoordinatorProcess:
    """A coordinator daemon process (`keyshard coordinator`) on free loopback ports; each
    start logs to `log_dir/coordinator-<n>.log`."""

    bootstrap: str
    log_dir: Path
    listen_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    extra: list[str] = field(default_factory=list)
    # Its own state topic, so coordinators of different tests (or two in one test) are
    # not replicas of each other; replicas are given the same one.
    state_topic: str = field(default_factory=lambda: f"__keyshard_state.{uuid.uuid4().hex[:8]}")
    replica_id: str | None = None
    preexec_fn: Callable[[], None] | None = None  # runs in the child, e.g. setrlimit
    # Sent with every admin API request of the harness (for --admin-auth-reads).
    admin_token: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # What runs it: `keyshard coordinator`, or `BUSY_COORDINATOR` (`hold_loop`).
    entry: tuple[str, ...] = ("-m", "keyshard", "coordinator")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the coordinator has not been started")
        return self.proc.pid

    async def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"coordinator-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *self.entry,
                "--bootstrap-servers",
                self.bootstrap,
                "--listen",
                self.address,
                "--admin-listen",
                f"127.0.0.1:{self.admin_port}",
                "--state-topic",
                self.state_topic,
                *(["--replica-id", self.replica_id] if self.replica_id else []),
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self.preexec_fn,
        )
        log.close()
        await wait_for(self.healthy, 30, "coordinator /healthz")
        await wait_for(self.ready, 30, "coordinator /readyz")

    def client(self, timeout: float = 5) -> httpx.AsyncClient:
        """For the admin API (HTTPS coordinators trust their CA here)."""
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else None
        return httpx.AsyncClient(timeout=timeout, headers=headers)

    async def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"coordinator exited: {self.read_log()[-2000:]}")
        try:
            async with self.client(timeout=1) as client:
                return (await client.get(f"{self.admin_url}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def ready(self) -> bool:
        """Serving: caught up on the state log and owning the partitions placed on it."""
        async with self.client() as client:
            return (await client.get(f"{self.admin_url}/readyz")).status_code == 200

    async def served_by(self, group: str = GROUP) -> str | None:
        """The replica serving `group` as this one says (known groups or not)."""
        async with self.client() as client:
            response = await client.get(f"{self.admin_url}/v1/groups/{group}")
        served_by: str | None = response.headers.get("x-keyshard-served-by")
        return served_by

    async def group(self, group: str = GROUP, timeout: float = 5) -> dict[str, Any] | None:
        async with self.client(timeout) as client:
            response = await client.get(f"{self.admin_url}/v1/groups/{group}")
        return response.json() if response.status_code == 200 else None

    async def settled(self, members: int, group: str = GROUP) -> dict[str, Any] | None:
        """The group's view once it has `members` members and every slot runs somewhere."""
        view = await self.group(group)
        return view if is_settled(view, members) else None

    def read_log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob("coordinator-*.log"))
        )

    def kill(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            self.thaw()  # a frozen process would take its SIGTERM only when thawed
            stop_process(self.proc)

    def freeze(self) -> None:
        """SIGSTOP: alive to the kernel (its sockets stay open), silent to everyone."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def hold_loop(self) -> None:
        """SIGUSR1 to a `BUSY_COORDINATOR`: its event loop stops for `KEYSHARD_BUSY_S`
        seconds, its other threads do not."""
        assert self.proc is not None and self.entry == BUSY_COORDINATOR
        self.proc.send_signal(signal.SIGUSR1)


@dataclass
class Workers:
    """Consumer worker processes of one group: `keyshard demo-worker` (`spawn`) or
    `keyshard worker TARGET` (`spawn_cli`), each logging what it processed to
    `out_dir/<name>.jsonl`."""

    coordinator: CoordinatorProcess
    out_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    topic: str = TOPIC
    group: str = GROUP
    kafka_config: str | None = None  # a .properties file of Kafka client settings
    # The coordinator addresses workers are given (default: the coordinator's own).
    addresses: str | None = None
    topic_pattern: str | None = None  # `spawn`: every topic matching it, not `topic`

    def spawn(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        err = open(self.out_dir / f"{name}.err", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            worker_command(
                name=name,
                coordinator=self.addresses or self.coordinator.address,
                bootstrap=self.coordinator.bootstrap,
                out=self.out_dir / f"{name}.jsonl",
                extra=list(extra),
                topic=self.topic,
                group=self.group,
                kafka_config=self.kafka_config,
                topic_pattern=self.topic_pattern,
            ),
            stdout=err,
            stderr=subprocess.STDOUT,
        )
        err.close()
        self.procs[name] = proc
        return proc

    def spawn_cli(
        self, name: str, *extra: str, target: str = "tests.integration.worker_app:handle",
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        """`keyshard worker TARGET` (keyshard.cli.worker) as a user runs it, configured
        through KEYSHARD_* variables and flags; stdout (its log) in NAME.log, stderr in
        NAME.err, its records in NAME.jsonl. TARGET defaults to the integration tests' app,
        which writes those records."""
        variables = {
            **os.environ,
            "KEYSHARD_GROUP": self.group,
            "KEYSHARD_TOPICS": self.topic,
            "KEYSHARD_COORDINATOR": self.addresses or self.coordinator.address,
            "KEYSHARD_BOOTSTRAP_SERVERS": self.coordinator.bootstrap,
            "KEYSHARD_NAME": name,
            "KEYSHARD_TEST_OUT": str(self.out_dir / f"{name}.jsonl"),
            **(env or {}),
        }
        with open(self.out_dir / f"{name}.log", "wb") as out, \
                open(self.out_dir / f"{name}.err", "wb") as err:  # fmt: skip
            proc = subprocess.Popen(
                [sys.executable, "-m", "keyshard", "worker", target, *extra],
                stdout=out, stderr=err, env=variables,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def output(self, name: str, stream: str = "log") -> str:
        return (self.out_dir / f"{name}.{stream}").read_text(errors="replace")

    def processed(self) -> list[Processed]:
        return read_processed(self.out_dir.glob("*.jsonl"))

    def unique(self) -> int:
        return len({(e.partition, e.offset) for e in self.processed()})

    def stop(self, name: str) -> None:
        stop_process(self.procs[name])

    def kill(self, name: str) -> None:
        stop_process(self.procs[name], signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop_process(proc)


@dataclass
class ReplicaSet:
    """Coordinator replicas sharing one state topic (r0, r1, ...), started on demand; as
    the Helm chart runs them, with one replica secret (`signed=False`: none)."""

    bootstrap: str
    log_dir: Path
    extra: list[str] = field(default_factory=list)
    state_topic: str = field(default_factory=lambda: f"__keyshard_state.{uuid.uuid4().hex[:8]}")
    replicas: dict[str, CoordinatorProcess] = field(default_factory=dict)
    signed: bool = True

    @property
    def secret_file(self) -> Path:
        """The replica secret every replica reads (written on first use)."""
        path = self.log_dir / "replica-secret"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32) + "\n")
        return path

    def add(self, replica_id: str) -> CoordinatorProcess:
        log_dir = self.log_dir / replica_id
        log_dir.mkdir(parents=True, exist_ok=True)
        signing = ["--replica-secret-file", str(self.secret_file)] if self.signed else []
        replica = CoordinatorProcess(
            self.bootstrap, log_dir, extra=[*signing, *self.extra], state_topic=self.state_topic,
            replica_id=replica_id,
        )  # fmt: skip
        self.replicas[replica_id] = replica
        return replica

    async def start(self, *replica_ids: str) -> None:
        """Start these replicas at once; each must become ready (placed and serving)."""
        started = [self.replicas.get(r) or self.add(r) for r in replica_ids]
        await asyncio.gather(*(r.start() for r in started))

    @property
    def addresses(self) -> str:
        """Every replica's consumer address, running or not: what a headless Service gives."""
        return ",".join(r.address for r in self.replicas.values())

    def running(self) -> list[CoordinatorProcess]:
        return [r for r in self.replicas.values() if r.proc is not None and r.proc.poll() is None]

    async def owner(self, group: str = GROUP) -> CoordinatorProcess | None:
        """The replica serving `group`, as the one serving it says (forwarded answers
        name it in served_by)."""
        for replica in self.running():
            with contextlib.suppress(httpx.HTTPError):
                served_by = await replica.served_by(group)
                if served_by is not None:
                    return self.replicas[served_by]
        return None

    async def group(self, group: str = GROUP) -> dict[str, Any] | None:
        owner = await self.owner(group)
        return None if owner is None else await owner.group(group)

    async def settled(self, members: int, group: str = GROUP) -> dict[str, Any] | None:
        view = await self.group(group)
        return view if is_settled(view, members) else None

    def stop_all(self) -> None:
        for replica in self.replicas.values():
            replica.stop()
