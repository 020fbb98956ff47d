"""Coordinator failover under load: what consumers see when the replica serving them goes.

    .venv/bin/python -m bench.failover                  # 2 rounds, Tansu
    .venv/bin/python -m bench.failover --quick          # 1 round, shorter
    .venv/bin/python -m bench.failover --broker kafka   # Apache Kafka 4.x

One broker (the embedded Tansu, or the Apache Kafka node of harness.brokers.kafka) and,
per scenario, fresh coordinator processes on a state topic of their own, 4 real consumer
processes (`keyshard.local.demo_worker`, session timeout 10 s, given every replica's address as
a headless Service would) and steady keyed traffic. The processes, the traffic and the
contract check are the integration tests' (the harness,
keyshard/local/verify.py). Scenarios, one after another in the same run:

- kill: `kill -9` of the replica serving the group (3 replicas);
- sigterm: SIGTERM of it (a rolling update: it hands its partitions over, then exits);
- freeze: the serving replica is frozen (SIGSTOP) past the replica timeout, then thawed
  (SIGCONT). A frozen process is the model of a network-isolated one: alive, its sockets
  open, silent to everyone; after SIGCONT it finds itself fenced;
- restart-1: today's single coordinator (1 replica) `kill -9`ed and restarted 2 s later;
- none: no failure at all, the control: the same traffic and the same joining consumer,
  so the noise floor of every figure on this (shared) machine.

At the failure instant a 5th consumer is started for the group (the one that "joins right
after the failure"). Per scenario:
- extra delay (unmoved ranges): every record's delay is handler start minus send time;
  the normal p99 is that of records sent in the `--pre` seconds before the failure; the
  figure is the largest delay of a record sent from 1 s before the failure to the end of
  the traffic, of a slot owned by the same member before the failure and at the end,
  minus the normal p99. Slots handed to the joiner are reported apart (moved);
- lost, duplicates (handler runs beyond one per record), per-key order violations: the
  contract check of the integration tests over every record of the scenario;
- takeover: failure -> a replica other than the failed one (restart-1: the restarted
  one) answers for the group as the one serving it;
- joiner served: failure -> the joiner's first handler run (this includes starting a
  Python process, ~1-2 s here; the `none` row is that cost alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import RESULTS
from bench._common import machine
from harness import (
    CoordinatorProcess,
    ReplicaSet,
    Workers,
    create_topic,
    markdown_table,
    owned_ranges,
    percentile,
    produce,
    wait_for,
)
from harness.brokers import BROKER_KINDS, Broker, running_broker
from keyshard.core.model.ranges import EMPTY
from keyshard.local.verify import Processed, Produced, check

SCENARIOS = ("kill", "sigterm", "freeze", "restart-1", "none")
LABELS = {
    "kill": "(a) kill -9 of the serving replica (3 replicas)",
    "sigterm": "(b) SIGTERM of the serving replica (rolling update)",
    "freeze": "(c) serving replica isolated (SIGSTOP past the replica timeout, then SIGCONT)",
    "restart-1": "(d) single coordinator: kill -9, restarted 2 s later",
    "none": "(e) control: no failure (joiner only)",
}
SHORT = {
    "kill": "(a) kill -9",
    "sigterm": "(b) SIGTERM",
    "freeze": "(c) frozen",
    "restart-1": "(d) 1 coordinator,\nrestarted",
    "none": "(e) no failure",
}
CONSUMERS = 4
SESSION = ("--session-timeout-ms", "10000")
KEYS = 200
RESTART_AFTER_S = 2.0  # restart-1: as the baseline measurement


@dataclass
class Outcome:
    scenario: str
    round: int
    normal_p50_ms: float = 0.0
    normal_p99_ms: float = 0.0
    unmoved_extra_ms: float = 0.0  # largest delay after the failure minus the normal p99
    moved_extra_ms: float | None = None  # the joiner's slots
    moved_slots: int = 0
    produced: int = 0
    lost: int = 0
    duplicates: int = 0
    order_violations: int = 0
    takeover_s: float | None = None
    joiner_served_s: float | None = None
    members_kept: bool = False  # the 4 members kept their ids (adopted, not replaced)
    owner: str = ""  # the replica that failed (its place in the consumers' address list)
    handoffs: dict[str, int] = field(default_factory=dict)  # by kind, as the last owner has them
    load: str = ""
    notes: list[str] = field(default_factory=list)


async def _view(client: httpx.AsyncClient, replica: CoordinatorProcess, group: str) -> Any:
    """`replica`'s answer for `group` (None: no answer in time, or not known)."""
    try:
        response = await client.get(f"{replica.admin_url}/v1/groups/{group}")
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


async def _served_by_other(
    replicas: list[CoordinatorProcess], failed: CoordinatorProcess, group: str, *, same: bool
) -> str | None:
    """The id of the replica serving `group` if it is not `failed` (`same`: if it is
    `failed`, restarted), asking every running replica in `replicas`."""
    async with httpx.AsyncClient(timeout=0.5) as client:
        views = await asyncio.gather(
            *(_view(client, r, group) for r in replicas if r.proc and r.proc.poll() is None)
        )
    for view in views:
        if view is None:
            continue
        served = view["served_by"]["replica_id"]
        if (served == failed.replica_id) == same:
            return str(served)
    return None


def _fail(owner: CoordinatorProcess, scenario: str) -> None:
    if scenario in ("kill", "restart-1"):
        owner.kill()
    elif scenario == "sigterm":
        assert owner.proc is not None
        owner.proc.terminate()  # not stop(): that would wait for the exit here
    elif scenario == "freeze":
        owner.freeze()


async def run_scenario(
    broker: Broker, scenario: str, rnd: int, args: argparse.Namespace, work: Path
) -> Outcome:
    out = work / f"{scenario}-{rnd}"
    # A previous invocation's handler logs would be read as this one's (same topic names).
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    topic, group = f"failover.{scenario}.{rnd}", f"failover-{scenario}-{rnd}"
    extra = ["--drain-timeout-ms", "2000", "--replica-timeout-ms", str(args.replica_timeout_ms)]
    replicas = ReplicaSet(broker.bootstrap_servers, out, extra=extra)
    consumers = Workers(
        CoordinatorProcess(broker.bootstrap_servers, out), out, topic=topic, group=group
    )
    result = Outcome(scenario, rnd, load=" ".join(f"{x:.1f}" for x in _loadavg()))
    try:
        ids = ["r0"] if scenario == "restart-1" else ["r0", "r1", "r2"]
        await replicas.start(*ids)
        await create_topic(broker.bootstrap_servers, topic)
        consumers.addresses = replicas.addresses
        for i in range(CONSUMERS):
            consumers.spawn(f"c{i}", *SESSION)
        before = await wait_for(lambda: replicas.settled(CONSUMERS, group), 60, "4 members")
        owner = await replicas.owner(group)
        assert owner is not None and owner.replica_id is not None
        result.owner = owner.replica_id
        sent_ns: list[int] = []
        count = int(args.rate * (args.pre + args.post))
        producing = asyncio.ensure_future(
            produce(broker.bootstrap_servers, count, KEYS, topic=topic, rate=args.rate,
                    sent_ns=sent_ns)
        )  # fmt: skip
        await asyncio.sleep(args.pre)

        failed_at = time.monotonic_ns()
        _fail(owner, scenario)
        consumers.spawn("joiner", *SESSION)
        restart: asyncio.Task[None] | None = None
        if scenario == "restart-1":
            restart = asyncio.create_task(_restart_later(owner))
        if scenario != "none":
            others = list(replicas.replicas.values())
            if scenario != "restart-1":
                others = [r for r in others if r is not owner]
            served = await wait_for(
                lambda: _served_by_other(others, owner, group, same=scenario == "restart-1"),
                60, "the group served again", interval=0.02,
            )  # fmt: skip
            result.takeover_s = (time.monotonic_ns() - failed_at) / 1e9
            print(f"  {scenario}: served by {served} after {result.takeover_s:.2f} s", flush=True)
        if scenario == "freeze":
            await asyncio.sleep(max(0.0, failed_at / 1e9 + args.freeze_s - time.monotonic()))
            owner.thaw()
        if restart is not None:
            await restart
        after = await wait_for(
            lambda: replicas.settled(CONSUMERS + 1, group), 60, "5 settled members"
        )
        produced: list[Produced] = await producing
        try:
            await wait_for(lambda: consumers.unique() >= len(produced), 60, "all processed")
        except AssertionError as err:
            result.notes.append(str(err))
        await asyncio.sleep(0.5)  # duplicates, if any, come after the last new record
        after = await replicas.settled(CONSUMERS + 1, group) or after
        _analyse(result, produced, sent_ns, consumers.processed(), before, after, failed_at, args)
        return result
    finally:
        consumers.stop_all()
        replicas.stop_all()


async def _restart_later(replica: CoordinatorProcess) -> None:
    await asyncio.sleep(RESTART_AFTER_S)
    await replica.start()


def _loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def _analyse(
    result: Outcome,
    produced: list[Produced],
    sent_ns: list[int],
    processed: list[Processed],
    before: dict[str, Any],
    after: dict[str, Any],
    failed_at: int,
    args: argparse.Namespace,
) -> None:
    report = check(produced, processed)
    result.produced = len(produced)
    result.lost = len(report.lost)
    result.duplicates = report.duplicates
    result.order_violations = len(report.order_violations)
    owners_before = owned_ranges(before)
    owners_after = owned_ranges(after)
    result.members_kept = set(owners_before) <= set(owners_after)
    unmoved = EMPTY
    for member, ranges in owners_before.items():
        unmoved = unmoved | (ranges & owners_after.get(member, EMPTY))
    result.moved_slots = 65536 - unmoved.size
    for h in after.get("handoffs", []):
        result.handoffs[h["kind"]] = result.handoffs.get(h["kind"], 0) + 1

    sent = {(p.partition, p.offset): t for p, t in zip(produced, sent_ns, strict=True)}
    first: dict[tuple[int, int], Processed] = {}
    for e in processed:
        key = (e.partition, e.offset)
        if key not in first or e.t0 < first[key].t0:
            first[key] = e
    joiner = [e.t0 for e in processed if e.worker == "joiner"]
    if joiner:
        result.joiner_served_s = (min(joiner) - failed_at) / 1e9
    normal: list[float] = []
    unmoved_d: list[float] = []
    moved_d: list[float] = []
    for key, e in first.items():
        t = sent.get(key)
        if t is None:
            continue
        delay = (e.t0 - t) / 1e6
        if failed_at - args.pre * 1e9 + 1e9 <= t < failed_at - 0.5e9:
            normal.append(delay)
        elif t >= failed_at - 1e9:
            (unmoved_d if e.slot in unmoved else moved_d).append(delay)
    result.normal_p50_ms = percentile(normal, 50)
    result.normal_p99_ms = percentile(normal, 99)
    result.unmoved_extra_ms = max(unmoved_d, default=0.0) - result.normal_p99_ms
    if moved_d:
        result.moved_extra_ms = max(moved_d) - result.normal_p99_ms


# ---- reporting --------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def table(results: list[Outcome]) -> str:
    rows = []
    for scenario in SCENARIOS:
        rs = [r for r in results if r.scenario == scenario]
        if not rs:
            continue

        def each(get: Any, digits: int = 2, rs: list[Outcome] = rs) -> str:
            values = [get(r) for r in rs]
            shown = ", ".join(_fmt(v, digits=digits) for v in values)
            known = [v for v in values if v is not None]
            if len(values) == 1 or not known:
                return shown
            return f"{max(known):.{digits}f} ({shown})"

        rows.append(
            [
                LABELS[scenario],
                each(lambda r: r.takeover_s),
                each(lambda r: r.unmoved_extra_ms, 0),
                ", ".join(f"{r.normal_p50_ms:.0f} / {r.normal_p99_ms:.0f}" for r in rs),
                each(lambda r: r.moved_extra_ms, 0),
                ", ".join(str(r.lost) for r in rs),
                ", ".join(str(r.duplicates) for r in rs),
                ", ".join(str(r.order_violations) for r in rs),
                each(lambda r: r.joiner_served_s),
                ", ".join(f"{r.moved_slots:,}{_kinds(r.handoffs)}" for r in rs),
                ", ".join("yes" if r.members_kept else "no" for r in rs),
                ", ".join(r.owner for r in rs),
                ", ".join(r.load for r in rs),
            ]
        )
    return markdown_table(
        [
            "scenario", "takeover: failure -> group served again (s)",
            "largest extra record delay, unmoved ranges (ms over the normal p99)",
            "normal record delay p50 / p99 (ms)",
            "slots that changed owner (joiner's, or a replaced member's): largest extra delay (ms)",
            "records lost", "duplicates", "per-key order violations",
            "failure -> joining consumer's first record (s)",
            "slots that changed owner (handoffs by kind)", "4 members adopted",
            "failed replica (of r0, r1, r2)",
            "load average (1/5/15 min) at start",
        ],
        rows,
    )  # fmt: skip


def _kinds(handoffs: dict[str, int]) -> str:
    return f" ({', '.join(f'{k} {n}' for k, n in sorted(handoffs.items()))})" if handoffs else ""


def plot(results: list[Outcome], path: Path) -> None:
    """Per scenario, every round: the three times, on a log scale (ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: list[tuple[str, Callable[[Outcome], float | None]]] = [
        ("takeover", lambda r: None if r.takeover_s is None else r.takeover_s * 1e3),
        ("largest extra delay,\nunmoved ranges", lambda r: r.unmoved_extra_ms),
        ("joiner's first record", lambda r: _ms(r.joiner_served_s)),
    ]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.25
    for j, (name, get) in enumerate(series):
        xs, ys = [], []
        for i, scenario in enumerate(SCENARIOS):
            for r in results:
                value = get(r) if r.scenario == scenario else None
                if value is not None:
                    xs.append(i + (j - 1) * width)
                    ys.append(max(value, 1.0))
        ax.plot(xs, ys, "o", alpha=0.7, label=name)
    ax.axhline(1000, ls=":", color="tab:red", label="acceptance: extra delay < 1 s")
    ax.set_xticks(range(len(SCENARIOS)), [SHORT[s] for s in SCENARIOS], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title("coordinator failover under load (4 consumers, a 5th joining at the failure)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


async def run_all(args: argparse.Namespace) -> list[Outcome]:
    work = Path(args.out_dir)
    results: list[Outcome] = []
    with running_broker(args.broker) as broker:
        for rnd in range(args.rounds):
            for scenario in args.scenarios:
                print(f"round {rnd + 1}, {scenario} (load {_loadavg()[0]:.1f})", flush=True)
                r = await run_scenario(broker, scenario, rnd, args, work)
                print(f"  {asdict(r)}", flush=True)
                results.append(r)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, shorter traffic")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--rate", type=float, default=800.0, help="records/s, over 200 keys")
    parser.add_argument("--pre", type=float, default=8.0, help="s of traffic before failing")
    parser.add_argument("--post", type=float, default=17.0, help="s of traffic after it")
    parser.add_argument("--freeze-s", type=float, default=5.0, help="freeze: SIGCONT after")
    parser.add_argument("--replica-timeout-ms", type=int, default=2000)
    parser.add_argument("--out-dir", default="/tmp/keyshard-bench-failover")
    parser.add_argument("--json", default=str(RESULTS / "failover.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "failover.md"))
    parser.add_argument("--plot", default=str(RESULTS / "failover.png"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.pre, args.post = 1, 5.0, 12.0
    began = time.monotonic()
    header = machine()
    print(header, flush=True)
    results = asyncio.run(run_all(args))
    command = (
        f".venv/bin/python -m bench.failover {' '.join(sys.argv[1:])}".strip()
        + f"  ({time.monotonic() - began:.0f} s; broker {args.broker}, {args.rate:.0f} records/s, "
        f"{args.pre:.0f} s before and {args.post:.0f} s after the failure, replica timeout "
        f"{args.replica_timeout_ms} ms, session timeout 10 s)"
    )
    text = f"{header}\n\n`{command}`\n\n{table(results)}\n"
    notes = [f"- {r.scenario} round {r.round + 1}: {n}" for r in results for n in r.notes]
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    print()
    print(text)
    Path(args.markdown).write_text(text)
    Path(args.json).write_text(
        json.dumps({"machine": header, "command": command, "results": [asdict(r) for r in results]},
                   indent=1)
    )  # fmt: skip
    plot(results, Path(args.plot))
    print(f"written: {args.markdown}, {args.json}, {args.plot}")


if __name__ == "__main__":
    main()
