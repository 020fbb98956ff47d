"""Coordinator scale: 1,000 and 5,000 simulated consumers registering at once.

    python -m bench.coord_scale            # 1,000 and 5,000 members, 3 runs each
    python -m bench.coord_scale --quick    # 1,000 and 5,000 members, 1 run each, short windows
    python -m bench.coord_scale --replicas 3 --groups 150 --members 15000   # 3 replicas

With `--replicas N` the coordinator runs as N replicas on one state topic (fresh per run)
and the members are split over `--groups` groups; each group's consumers connect to the
replica serving it (bench._coord_replicas) and CPU is reported per replica. The
simulated consumers follow a takeover as real ones do (docs/protocol.md §7.4): when their
channel closes they ask the replicas which one serves the group now and register there
with their claim while their lease holds (a session timeout since a coordinator last
spoke to them), or anew once it ran out; a run counts both.

A real Tansu broker and a real coordinator process (`keyshard coordinator`); the consumers
are protocol-level clients (coordinator/protocol/: codec and channel), several
hundred per process, in several processes. Each one behaves like consumer_client's
`_on_request`: it answers Ping with the positions of the slots it owns, StartFetcher by
taking the ranges, StopFetcher by replying with the final positions of the stopped ranges
(from a task, after the event-loop turn, as `_finish_stop` does with nothing in flight).
They do not fetch from Kafka: this measures the coordinator, not the brokers.

Measured per run:
- time to a stable assignment: from the moment every client starts connecting to the last
  StopFetcher/StartFetcher any client received, once every member is registered, the
  slots owned by all clients sum to 65,536, and no Stop/Start arrived for a quiet period
  (then confirmed through the admin API: N members, nothing draining/starting/unowned);
- coordinator CPU (utime+stime from /proc/<pid>/stat) over a window of steady pings,
  as a fraction of one core; the clients ping at the group's ping interval;
- coordinator RSS before the clients connect and at steady state;
- the longest silence any client saw between two coordinator requests (the client-side
  sign of an overloaded coordinator: above the session timeout a real client gives up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import RESULTS
from bench._common import ROOT, machine
from bench._coord_replicas import groups_settled, placed_groups, start_replicas, worker_plans
from harness import (
    CoordinatorProcess,
    append,
    cpu_seconds,
    create_topic,
    markdown_table,
    median,
    rss_mib,
)
from keyshard.core.model.addresses import parse_host_port
from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import EMPTY, RangeSet
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    MemberClaim,
    Message,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from keyshard.core.protocol.wire import (
    positions_from_wire,
    positions_to_wire,
    ranges_from_wire,
    ranges_to_wire,
)
from keyshard.local.broker import EmbeddedBroker

TOPIC = "scale.events"
# Records in each partition of the topic: the simulated consumers report progress within
# them (a coordinator fences a member reporting a position past a partition's end), 10 a
# ping, which a run does not get near.
FILLED = 2_000
# Between two rounds of looking for a group's coordinator, as consumer_client waits
# (consumer_client._membership.state.retry_delay): doubling from the first to the last, at
# most the riding one while the member holds a claim. Thousands of clients retrying at a
# fixed short interval would be a storm of their own against a lagging replica.
FIRST_RETRY_S, LAST_RETRY_S, RIDING_RETRY_S = 0.1, 2.0, 0.5

# ---- the simulated consumers (worker processes) -------------------------------------


@dataclass
class SimStats:
    registered: int = 0  # clients registered at least once
    failed: int = 0
    adopted: int = 0  # registered again with a claim, and the claim was taken
    claims_refused: int = 0  # registered again with a claim, and had to start over
    leases_lost: int = 0  # found no coordinator within a session: registered anew
    busy: int = 0  # Registers refused as the coordinator is behind with them: retried
    starts: int = 0
    stops: int = 0
    pings: int = 0
    last_control: float = 0.0
    max_silence: float = 0.0
    clients: list[SimClient] = field(default_factory=list)


class Busy(Exception):
    """The coordinator serves as many Registers as it takes at once: try again later."""


class SimClient:
    """One consumer as the coordinator sees it: register, answer every request, and when
    the channel closes find the group's coordinator again and register there, with its
    claim (id, epoch, ranges, positions) while its lease holds."""

    def __init__(
        self, name: str, stats: SimStats, session_timeout_ms: int,
        replicas: list[tuple[str, int]],
    ) -> None:  # fmt: skip
        self.name = name
        self.stats = stats
        self.session_timeout_ms = session_timeout_ms
        self.replicas = replicas  # every replica's address: where to ask for the owner
        self.owned: RangeSet = EMPTY
        self.positions: dict[tuple[str, int], RangePositionMap] = {}
        self.last_heard = 0.0
        self.done = 0
        self.channel: Channel | None = None
        self.member_id: str | None = None
        self.member_epoch = 0
        self.coordinator_epoch = 0
        self._granted = EMPTY  # granted since the Register in flight was sent
        self.registered_once = False
        self._retry_s = FIRST_RETRY_S
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, host: str, port: int, group: str) -> None:
        """Serve the group until cancelled. A first Register refused other than for
        reaching a replica that does not serve the group, or for being one too many at
        once (the reference client retries both), fails the run (the coordinator turned a
        member away); anything later is followed."""
        where: tuple[str, int] = (host, port)
        while True:
            try:
                channel = await self._register(where, group)
            except Exception as err:
                moved = isinstance(err, RemoteError) and err.code is ErrorCode.NOT_COORDINATOR
                if not self.registered_once and not moved and not isinstance(err, Busy):
                    print(f"{self.name}: register failed: {err!r}", file=sys.stderr, flush=True)
                    self.stats.failed += 1
                    return
                await asyncio.sleep(self._retry_delay())
                where = await self._find(group)
                continue
            self._retry_s = FIRST_RETRY_S
            await channel.wait_closed()
            where = await self._find(group)

    def _retry_delay(self) -> float:
        delay = self._retry_s
        if self.member_id is not None:
            delay = min(delay, RIDING_RETRY_S)
        self._retry_s = min(self._retry_s * 2, LAST_RETRY_S)
        return delay

    async def _register(self, where: tuple[str, int], group: str) -> Channel:
        channel = await Channel.connect(*where, timeout=60, name=self.name)
        channel.set_request_handler(self._on_request)
        channel.start()
        if not self.last_heard:
            self.last_heard = time.monotonic()  # silence counts from the first connect
        claim = self._claim()
        if claim is None:
            self.owned, self.positions = EMPTY, {}
        self._granted = EMPTY
        try:
            reply = await channel.request(
                RegisterRequest(
                    correlation_id=0, group=group, topics=[TOPIC], consumer_name=self.name,
                    session_timeout_ms=self.session_timeout_ms, claim=claim,
                ),
                timeout=120,
            )  # fmt: skip
            if not isinstance(reply, RegisterResponse):
                raise RuntimeError(f"unexpected reply {reply.type}")
        except ChannelClosed:
            refused = channel.peer_error
            if refused is not None and refused.code is ErrorCode.TOO_MANY_CONNECTIONS:
                self.stats.busy += 1
                raise Busy(refused.message) from None
            raise
        except BaseException:
            channel.close()
            raise
        kept = EMPTY
        if claim is not None and reply.member_id == claim.member_id:
            self.stats.adopted += 1
            kept = self.owned & ranges_from_wire(reply.adopted)
        elif claim is not None:
            self.stats.claims_refused += 1
        if not self.registered_once:
            self.registered_once = True
            self.stats.registered += 1
        # A grant may be handled before this reply is (never sent before it): it stays.
        self.owned = kept | self._granted
        self.member_id, self.member_epoch = reply.member_id, reply.member_epoch
        self.coordinator_epoch = max(self.coordinator_epoch, reply.coordinator_epoch)
        self.channel = channel
        self._heard()
        return channel

    def _claim(self) -> MemberClaim | None:
        """What this member still runs, while its lease holds; None: register anew."""
        if self.member_id is None:
            return None
        if time.monotonic() - self.last_heard >= self.session_timeout_ms / 1000:
            self.stats.leases_lost += 1
            self.member_id = None
            return None
        report = {tp: pmap.segments(self.owned) for tp, pmap in self.positions.items()}
        return MemberClaim(
            member_id=self.member_id, member_epoch=self.member_epoch,
            owned=ranges_to_wire(self.owned), positions=positions_to_wire(report),
            coordinator_epoch=self.coordinator_epoch,
        )  # fmt: skip

    async def _find(self, group: str) -> tuple[str, int]:
        """Ask the replicas in turn which one serves `group` until one names an active
        owner, as consumer_client's Membership does."""
        while True:
            for host, port in self.replicas:
                with contextlib.suppress(Exception):
                    probe = await Channel.connect(host, port, timeout=5, name=f"{self.name}-probe")
                    probe.start()
                    try:
                        answer = await probe.request(
                            MetadataRequest(correlation_id=0, group=group), timeout=5
                        )
                    finally:
                        await probe.aclose()
                    if isinstance(answer, MetadataResponse) and answer.active:
                        return parse_host_port(answer.coordinator)
            await asyncio.sleep(self._retry_delay())

    def _heard(self) -> None:
        now = time.monotonic()
        if self.stats.registered and self.last_heard:
            self.stats.max_silence = max(self.stats.max_silence, now - self.last_heard)
        self.last_heard = now

    def _on_request(self, channel: Channel, message: Message) -> None:
        self._heard()
        if isinstance(message, PingRequest | StartFetcherRequest | StopFetcherRequest):
            self.member_epoch = max(self.member_epoch, message.member_epoch)
            self.coordinator_epoch = max(self.coordinator_epoch, message.coordinator_epoch)
        match message:
            case PingRequest():
                self.stats.pings += 1
                # Progress, as a consumer under load reports it: every member's positions
                # differ, so the coordinator's position maps hold one segment per range.
                self.done = min(self.done + 10, FILLED)
                for pmap in self.positions.values():
                    pmap.update((r, Position(self.done)) for r in self.owned)
                report = {tp: pmap.segments(self.owned) for tp, pmap in self.positions.items()}
                channel.reply(
                    message,
                    PingResponse(
                        correlation_id=0,
                        member_epoch=message.member_epoch,
                        positions=positions_to_wire(report),
                    ),
                )
            case StartFetcherRequest():
                self.stats.starts += 1
                self.stats.last_control = time.monotonic()
                slots = ranges_from_wire(message.ranges)
                for tp, segments in positions_from_wire(message.positions).items():
                    self.positions.setdefault(tp, RangePositionMap()).update(segments)
                self.owned = self.owned | slots
                self._granted = self._granted | slots
                channel.reply(
                    message,
                    StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch),
                )
            case StopFetcherRequest():
                self.stats.stops += 1
                self.stats.last_control = time.monotonic()
                slots = ranges_from_wire(message.ranges)
                task = asyncio.create_task(self._finish_stop(channel, message, slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case _:
                channel.fail(ErrorCode.UNEXPECTED_MESSAGE, f"unexpected {message.type}")

    async def _finish_stop(
        self, channel: Channel, request: StopFetcherRequest, slots: RangeSet
    ) -> None:
        await asyncio.sleep(0)  # nothing in flight: drained on the next loop turn
        final = {tp: pmap.segments(slots & self.owned) for tp, pmap in self.positions.items()}
        self.owned = self.owned - slots
        channel.reply(
            request,
            StopFetcherResponse(
                correlation_id=0,
                member_epoch=request.member_epoch,
                positions=positions_to_wire(final),
            ),
        )


async def worker_main(args: argparse.Namespace) -> None:
    """Start the consumers of `--plan` (JSON: [group, coordinator address, clients] each)
    at the time read from stdin; report status as JSON lines."""
    stats = SimStats()
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": True}), flush=True)
    line = await loop.run_in_executor(None, sys.stdin.readline)
    go_at = float(line)
    await asyncio.sleep(max(0.0, go_at - time.monotonic()))
    clients: list[SimClient] = []
    tasks = []
    replicas = [parse_host_port(a) for a in args.addresses.split(",") if a]
    for k, (group, address, count) in enumerate(json.loads(args.plan)):
        host, port = parse_host_port(address)
        for i in range(count):
            client = SimClient(
                f"sim-{args.index}-{k}-{i}", stats, args.session_timeout_ms,
                replicas or [(host, port)],
            )  # fmt: skip
            clients.append(client)
            tasks.append(asyncio.create_task(client.run(host, port, group)))
    try:
        while True:
            await asyncio.sleep(0.25)
            print(
                json.dumps(
                    {
                        "registered": stats.registered,
                        "failed": stats.failed,
                        "adopted": stats.adopted,
                        "claims_refused": stats.claims_refused,
                        "leases_lost": stats.leases_lost,
                        "busy": stats.busy,
                        "owning": sum(1 for c in clients if c.owned),
                        "slots": sum(c.owned.size for c in clients),
                        "starts": stats.starts,
                        "stops": stats.stops,
                        "pings": stats.pings,
                        "last_control": stats.last_control,
                        "max_silence": stats.max_silence,
                    }
                ),
                flush=True,
            )
    finally:
        for t in tasks:
            t.cancel()


# ---- the driver -------------------------------------------------------------------


@dataclass
class RunResult:
    members: int
    stable_s: float | None
    starts: int
    stops: int
    cpu_cores: float  # the busiest replica's (the only one's, with one replica)
    rss_idle_mib: float
    rss_mib: float
    max_silence_s: float
    pings_per_s: float
    note: str = ""
    replicas: int = 1
    groups: int = 1
    # Clients that followed a takeover: adopted with their claim, or registered anew
    # (their claim refused, or their lease ran out first).
    adopted: int = 0
    registered_anew: int = 0
    busy: int = 0  # Registers refused as one too many at once (and retried)
    # Per replica (r0, r1, ...): CPU at steady pings and from go to stable (cores),
    # members served, RSS at steady state.
    cpu_per_replica: list[float] = field(default_factory=list)
    storm_cpu_per_replica: list[float] = field(default_factory=list)
    members_per_replica: list[int] = field(default_factory=list)
    rss_per_replica: list[float] = field(default_factory=list)


class WorkerProc:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.status: dict[str, Any] = {}
        self.ready = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            data = json.loads(raw)
            if data.get("ready"):
                self.ready.set()
            else:
                self.status = data


async def one_run(
    broker: EmbeddedBroker,
    members: int,
    per_process: int,
    run: int,
    window_s: float,
    quiet_s: float,
    deadline_s: float,
    session_timeout_ms: int,
    log_dir: Path,
    replicas: int = 1,
    groups: int = 1,
    replica_timeout_ms: int | None = None,
) -> RunResult:
    stamp = f"{members}-{run}-{int(time.time())}"
    names = [f"scale-{stamp}"] if groups == 1 else [f"scale-{stamp}-g{k}" for k in range(groups)]
    # Every simulated client connects from 127.0.0.1: lift the per-address limit
    # (default 1,000, a flood guard) or the 1,001st registration is refused.
    limit = ["--max-connections-per-peer", str(members + 100)]
    if replica_timeout_ms is not None:
        limit += ["--replica-timeout-ms", str(replica_timeout_ms)]
    run_dir = log_dir / stamp
    run_dir.mkdir(parents=True)
    if replicas == 1:
        coords = [CoordinatorProcess(broker.bootstrap_servers, run_dir, extra=limit)]
        await coords[0].start()
    else:
        coords = await start_replicas(broker.bootstrap_servers, replicas, run_dir, limit)
    procs: list[WorkerProc] = []
    try:
        owners = await placed_groups(coords, names)
        await asyncio.sleep(1.0)
        rss_idle = max(rss_mib(c.pid) for c in coords)
        sizes = {g: members // groups + (k < members % groups) for k, g in enumerate(names)}
        for index, plan in enumerate(worker_plans(sizes, owners, per_process)):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.coord_scale", "--worker", "--index", str(index),
                "--plan", json.dumps(plan), "--session-timeout-ms", str(session_timeout_ms),
                "--addresses", ",".join(c.address for c in coords),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
            )  # fmt: skip
            procs.append(WorkerProc(proc))
        await asyncio.wait_for(asyncio.gather(*(p.ready.wait() for p in procs)), 120)
        go_at = time.monotonic() + 0.5
        for p in procs:
            assert p.proc.stdin is not None
            p.proc.stdin.write(f"{go_at}\n".encode())
            await p.proc.stdin.drain()
        await asyncio.sleep(max(0.0, go_at - time.monotonic()))
        cpu_go = [cpu_seconds(c.pid) for c in coords]

        def total(key: str) -> int:
            return sum(int(p.status.get(key, 0)) for p in procs)

        stable_s: float | None = None
        note = ""
        cpu_stable = cpu_go
        while time.monotonic() < go_at + deadline_s:
            await asyncio.sleep(0.25)
            if total("failed"):
                note = f"{total('failed')} registrations failed"
                break
            last = max(float(p.status.get("last_control", 0.0)) for p in procs)
            if (
                total("registered") == members
                and total("owning") == members
                and total("slots") == SLOT_COUNT * groups
                and time.monotonic() - last >= quiet_s
            ):
                stable_s = last - go_at
                cpu_stable = [cpu_seconds(c.pid) for c in coords]
                break
        else:
            note = f"not stable within {deadline_s:.0f} s"
            cpu_stable = [cpu_seconds(c.pid) for c in coords]
        unsettled = await groups_settled(owners, sizes) if stable_s is not None else []
        if unsettled:
            note = f"admin API: {len(unsettled)} group(s) not settled ({unsettled[0]})"
            stable_s = None
        # Steady state: every member has been pinged at least once since settling.
        await asyncio.sleep(1.0)
        pings0, t0 = total("pings"), time.monotonic()
        cpu0 = [cpu_seconds(c.pid) for c in coords]
        await asyncio.sleep(window_s)
        await asyncio.sleep(0.3)  # one more status line
        cpu1, t1, pings1 = [cpu_seconds(c.pid) for c in coords], time.monotonic(), total("pings")
        steady = [(b - a) / (t1 - t0) for a, b in zip(cpu0, cpu1, strict=True)]
        storm_s = stable_s if stable_s else deadline_s  # not stable: go -> deadline
        storm = [(b - a) / storm_s for a, b in zip(cpu_go, cpu_stable, strict=True)]
        return RunResult(
            members=members,
            stable_s=stable_s,
            starts=total("starts"),
            stops=total("stops"),
            cpu_cores=max(steady),
            rss_idle_mib=rss_idle,
            rss_mib=max(rss_mib(c.pid) for c in coords),
            max_silence_s=max(float(p.status.get("max_silence", 0.0)) for p in procs),
            pings_per_s=(pings1 - pings0) / (t1 - t0),
            note=note,
            replicas=replicas,
            groups=groups,
            adopted=total("adopted"),
            registered_anew=total("claims_refused") + total("leases_lost"),
            busy=total("busy"),
            cpu_per_replica=steady,
            storm_cpu_per_replica=storm,
            members_per_replica=[
                sum(n for g, n in sizes.items() if owners[g] is c) for c in coords
            ],
            rss_per_replica=[rss_mib(c.pid) for c in coords],
        )
    finally:
        for p in procs:
            if p.proc.returncode is None:
                p.proc.terminate()
        for p in procs:
            try:
                await asyncio.wait_for(p.proc.wait(), 15)
            except TimeoutError:
                p.proc.kill()
                await p.proc.wait()
            p.reader.cancel()
        for c in coords:
            c.stop()


async def driver(args: argparse.Namespace) -> list[RunResult]:
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before the runs
    broker = EmbeddedBroker()
    broker.start()
    results = []
    try:
        await create_topic(broker.bootstrap_servers, TOPIC, args.partitions)
        filler = [(b"k", b"v")] * FILLED
        for partition in range(args.partitions):
            await append(broker.bootstrap_servers, TOPIC, partition, *filler)
        for members in args.members:
            for run in range(args.runs):
                r = await one_run(
                    broker, members, args.per_process, run, args.window, args.quiet,
                    args.deadline, args.session_timeout_ms, log_dir, args.replicas,
                    args.groups, args.replica_timeout_ms,
                )  # fmt: skip
                if args.replicas > 1:
                    print(
                        f"  per replica: members {r.members_per_replica}, CPU steady "
                        f"{[round(c, 3) for c in r.cpu_per_replica]}, CPU registering "
                        f"{[round(c, 3) for c in r.storm_cpu_per_replica]}, RSS "
                        f"{[round(m) for m in r.rss_per_replica]} MiB",
                        flush=True,
                    )
                print(
                    f"{members} members, run {run + 1}: stable "
                    f"{'-' if r.stable_s is None else f'{r.stable_s:.2f} s'}, "
                    f"{r.starts} starts / {r.stops} stops, CPU {r.cpu_cores:.3f} cores, "
                    f"RSS {r.rss_idle_mib:.0f} -> {r.rss_mib:.0f} MiB, "
                    f"{r.pings_per_s:.0f} pings/s, max silence {r.max_silence_s:.2f} s, "
                    f"after a takeover {r.adopted} adopted / {r.registered_anew} anew, "
                    f"{r.busy} registers refused as busy {r.note}",
                    flush=True,
                )
                results.append(r)
    finally:
        broker.stop()
    return results


def summarize(results: list[RunResult], args: argparse.Namespace) -> str:
    rows = []
    for members in args.members:
        rs = [r for r in results if r.members == members]
        stable = [r.stable_s for r in rs if r.stable_s is not None]
        each = ", ".join("-" if r.stable_s is None else f"{r.stable_s:.2f}" for r in rs)
        rows.append(
            [
                f"{members:,}",
                f"{len(rs)}",
                (f"{median(stable):.2f} s, worst {max(stable):.2f} s" if len(stable) == len(rs)
                 else f"{len(rs) - len(stable)} of {len(rs)} not stable")
                + f" ({each})",
                f"{median([r.starts for r in rs]):.0f} / {median([r.stops for r in rs]):.0f}",
                f"{median([r.cpu_cores for r in rs]):.3f} "
                f"({', '.join(f'{r.cpu_cores:.2f}' for r in rs)})",
                f"{median([r.pings_per_s for r in rs]):.0f}",
                f"{median([r.rss_idle_mib for r in rs]):.0f} -> "
                f"{median([r.rss_mib for r in rs]):.0f}",
                f"{max(r.max_silence_s for r in rs):.2f} s",
            ]
        )  # fmt: skip
    return markdown_table(
        [
            "members", "runs", "time to stable (median, worst; every run)",
            "StartFetcher / StopFetcher sent (median)",
            "coordinator CPU at steady pings (cores; every run)", "pings/s",
            "coordinator RSS idle -> steady (MiB)",
            "longest silence seen by a client",
        ],
        rows,
    )  # fmt: skip


def summarize_replicas(results: list[RunResult]) -> str:
    """One row per run: stability, and CPU / members / RSS per replica."""

    def each(values: list[float], digits: int = 2) -> str:
        return " / ".join(f"{v:.{digits}f}" for v in values)

    rows = [
        [
            f"{r.members:,}", f"{r.groups}", f"{r.replicas}",
            "-" if r.stable_s is None else f"{r.stable_s:.2f} s",
            f"{r.starts} / {r.stops}",
            " / ".join(f"{m:,}" for m in r.members_per_replica),
            each(r.storm_cpu_per_replica), each(r.cpu_per_replica),
            f"{r.pings_per_s:.0f}", each(r.rss_per_replica, 0),
            f"{r.max_silence_s:.2f} s", f"{r.adopted} / {r.registered_anew}", r.note or "",
        ]
        for r in results
    ]  # fmt: skip
    return markdown_table(
        [
            "members", "groups", "replicas", "time to stable",
            "StartFetcher / StopFetcher sent", "members per replica (r0 / r1 / r2)",
            "CPU per replica, go -> stable (cores)", "CPU per replica at steady pings (cores)",
            "pings/s (all)", "RSS per replica at steady state (MiB)",
            "longest silence seen by a client",
            "clients that followed a takeover: adopted / registered anew", "note",
        ],
        rows,
    )  # fmt: skip


def plot(results: list[RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    sizes = sorted({r.members for r in results})
    for ax, key, label, target in (
        (axes[0], "stable_s", "time to stable (s)", 10.0),
        (axes[1], "cpu_cores", "CPU at steady pings (cores)", 0.5),
        (axes[2], "rss_mib", "RSS at steady state (MiB)", None),
    ):
        for r in results:
            value = getattr(r, key)
            if value is not None:
                ax.plot(r.members, value, "o", color="tab:blue", alpha=0.6)
        meds = [
            median(
                [getattr(r, key) for r in results if r.members == m and getattr(r, key) is not None]
            )
            for m in sizes
        ]
        ax.plot(sizes, meds, "-", color="tab:blue")
        if target is not None:
            ax.axhline(target, ls=":", color="tab:red", label="target")
            ax.legend()
        ax.set_xlabel("simulated members")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run per size, short windows")
    parser.add_argument("--members", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-process", type=int, default=500, help="clients per process")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1, help="coordinator replicas")
    parser.add_argument("--groups", type=int, default=1, help="members split over this many")
    parser.add_argument(
        "--replica-timeout-ms", type=int, default=None, help="replicas' flag (default: theirs)"
    )
    parser.add_argument("--json", default=None, help="also write every run's results here")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000, help="as the client")
    parser.add_argument("--window", type=float, default=20.0, help="CPU window, s")
    parser.add_argument("--quiet", type=float, default=3.0, help="no Stop/Start this long = stable")
    parser.add_argument("--deadline", type=float, default=180.0)
    parser.add_argument("--log-dir", default="/tmp/keyshard-bench-scale")
    parser.add_argument("--plot", default=str(RESULTS / "coord_scale.png"))
    # worker mode (started by the driver)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plan", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("--addresses", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_main(args))
        return
    if args.quick:
        args.runs, args.window, args.quiet = 1, 8.0, 2.0
    print(machine(), flush=True)
    started = time.monotonic()
    results = asyncio.run(driver(args))
    table = summarize(results, args) if args.replicas == 1 else summarize_replicas(results)
    print()
    print(
        f"command: python -m bench.coord_scale {' '.join(sys.argv[1:])}  "
        f"({time.monotonic() - started:.0f} s)"
    )
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([vars(r) for r in results], indent=1))
    if args.replicas == 1:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
