"""A consumer's memory on a backlog: peak resident memory per consumer process.

    python -m bench.memory                 # the issue's four backlogs and a 2 GB one
    python -m bench.memory --quick         # the 600 MB backlog only
    python -m bench.memory --case 2gb      # one of them
    python -m bench.memory --max-buffer-bytes 100000000000   # as without a budget

A topic is filled with records of 10 KB (or 100 KB), then two `keyshard worker`
processes with default settings (a 5 ms handler, `--max-concurrency 8`) start on it; the
peak VmRSS of each (read from /proc every 50 ms) over its first 25 s is the number. They
then drain the backlog and stop gracefully, and the handlers' logs are checked: nothing
lost, no duplicates, each key in offset order (`keyshard.local.verify`). Apache Kafka by
default (its log directory under the run's temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MEASURE_S = 25.0
SAMPLE_S = 0.05
HANDLER_S = 0.005
CONCURRENCY = 8
WORKERS = 2
KEYS = 1000
_out: Any = None


async def handle(record: Any) -> None:
    """The workers' handler: 5 ms of waiting, then one line for the check."""
    t0 = time.monotonic_ns()
    await asyncio.sleep(HANDLER_S)
    _write(record, t0)


def _write(record: Any, t0: int) -> None:
    global _out
    if _out is None:
        _out = open(os.environ["KEYSHARD_BENCH_OUT"], "a", buffering=1 << 16)  # noqa: SIM115
    line = {
        "p": record.partition, "o": record.offset, "k": record.key.decode(), "s": 0,
        "w": os.environ.get("KEYSHARD_NAME", ""), "m": "", "t0": t0, "t1": time.monotonic_ns(),
    }  # fmt: skip
    _out.write(json.dumps(line) + "\n")
    _out.flush()


@dataclass(frozen=True)
class Case:
    records: int
    value_bytes: int
    partitions: int

    @property
    def label(self) -> str:
        total = self.records * self.value_bytes
        size = f"{total / 1e9:.0f} GB" if total >= 1e9 else f"{total / 1e6:.0f} MB"
        return f"{size} ({self.records:,} x {self.value_bytes // 1000} KB)"


#: The backlogs of issue 32's table, and a 2 GB one, by the name `--case` takes.
CASES = {
    "200mb": Case(20_000, 10_000, 2),
    "400mb": Case(40_000, 10_000, 4),
    "400mb-100k": Case(4_000, 100_000, 2),
    "600mb": Case(60_000, 10_000, 6),
    "2gb": Case(200_000, 10_000, 8),
}


@dataclass
class Result:
    case: str
    partitions: int
    peak_rss_mib: list[float]
    processed: int
    lost: int
    duplicates: int
    order_violations: int
    drained_s: float | None


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _fill(bootstrap: str, topic: str, case: Case) -> list[Any]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from keyshard.local.verify import Produced

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, case.partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
    )  # fmt: skip
    await producer.start()
    value = os.urandom(case.value_bytes)  # incompressible, like most real payloads
    produced = []
    try:
        pending: list[tuple[str, Any]] = []
        for i in range(case.records):
            key = f"key-{i % KEYS}"
            pending.append((key, await producer.send(topic, key=key.encode(), value=value)))
            if len(pending) >= 2000:
                for k, fut in pending:
                    meta = await fut
                    produced.append(Produced(meta.partition, meta.offset, k))
                pending.clear()
        for k, fut in pending:
            meta = await fut
            produced.append(Produced(meta.partition, meta.offset, k))
    finally:
        await producer.stop()
    return produced


def _run_case(cluster: Any, case: Case, work: Path, budget: int | None, n: int) -> Result:
    from keyshard.local.verify import check, read_processed

    topic, group = f"memory-{n}", f"memory-group-{n}"
    print(f"filling {topic}: {case.label}, {case.partitions} partitions", flush=True)
    produced = asyncio.run(_fill(cluster.bootstrap, topic, case))
    outs = [work / f"{topic}-w{i}.jsonl" for i in range(WORKERS)]
    procs = []
    for i, out in enumerate(outs):
        env = {
            **os.environ,
            "KEYSHARD_GROUP": group, "KEYSHARD_TOPICS": topic,
            "KEYSHARD_COORDINATOR": cluster.daemon.address,
            "KEYSHARD_BOOTSTRAP_SERVERS": cluster.bootstrap,
            "KEYSHARD_NAME": f"w{i}", "KEYSHARD_BENCH_OUT": str(out),
            "KEYSHARD_MAX_CONCURRENCY": str(CONCURRENCY),
        }  # fmt: skip
        if budget is not None:
            env["KEYSHARD_MAX_BUFFER_BYTES"] = str(budget)
        log = open(work / f"{topic}-w{i}.log", "wb")  # noqa: SIM115
        command = [sys.executable, "-m", "keyshard", "worker", "bench.memory:handle"]
        procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()
    peaks = [0] * WORKERS
    began = time.monotonic()
    while time.monotonic() - began < MEASURE_S:
        for i, proc in enumerate(procs):
            peaks[i] = max(peaks[i], _rss_kib(proc.pid))
        time.sleep(SAMPLE_S)
    drained: float | None = None
    deadline = began + MEASURE_S + 600
    while time.monotonic() < deadline:
        done = sum(_lines(out) for out in outs)
        if done >= len(produced):
            drained = time.monotonic() - began
            break
        if any(proc.poll() is not None for proc in procs):
            break
        time.sleep(0.5)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    report = check(produced, read_processed(outs))
    result = Result(
        case=case.label,
        partitions=case.partitions,
        peak_rss_mib=[round(kib / 1024, 1) for kib in peaks],
        processed=report.processed_unique,
        lost=len(report.lost),
        duplicates=report.duplicates,
        order_violations=len(report.order_violations),
        drained_s=round(drained, 1) if drained is not None else None,
    )
    print(result, flush=True)
    return result


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _table(results: list[Result], budget: int | None, label: str | None) -> str:
    shown = "default (64 MiB)" if budget is None else f"{budget:,} bytes"
    shown = f"max_buffer_bytes {shown}" if label is None else label
    rows = [
        f"Peak RSS per consumer process over its first {MEASURE_S:.0f} s; two `keyshard "
        f"worker` processes, {HANDLER_S * 1000:.0f} ms handler, --max-concurrency "
        f"{CONCURRENCY}, {shown}.",
        "",
        "| backlog | partitions | peak RSS per consumer (MiB) | processed | lost | duplicates "
        "| order violations | drained after (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        peaks = " / ".join(f"{p:.0f}" for p in r.peak_rss_mib)
        rows.append(
            f"| {r.case} | {r.partitions} | {peaks} | {r.processed:,} | {r.lost} | "
            f"{r.duplicates} | {r.order_violations} | {r.drained_s} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    from bench._common import Cluster, cleanup, machine, workdir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="kafka", choices=["kafka", "tansu"])
    parser.add_argument("--quick", action="store_true", help="the 600 MB backlog only")
    parser.add_argument(
        "--case", action="append", choices=sorted(CASES), help="these backlogs (default: all)"
    )
    parser.add_argument("--max-buffer-bytes", type=int, default=None)
    parser.add_argument("--stem", default="memory", help="results file names")
    parser.add_argument("--label", default=None, help="what ran, for the table (a build)")
    args = parser.parse_args(argv)
    names = ["600mb"] if args.quick else args.case or list(CASES)
    cases = [CASES[name] for name in names]
    work = workdir()
    results: list[Result] = []
    try:
        with Cluster(work, args.broker) as cluster:
            for n, case in enumerate(cases):
                results.append(_run_case(cluster, case, work, args.max_buffer_bytes, n))
    finally:
        cleanup(work)
    md = f"# Memory on a backlog ({args.broker})\n\n{machine()}\n\n" + _table(
        results, args.max_buffer_bytes, args.label
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.md").write_text(md)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(md)


if __name__ == "__main__":
    main()
