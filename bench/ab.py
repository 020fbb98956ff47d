"""keyshard against itself at another commit: the no-op filter path, run by run, as ratios.

A change to the data path is judged by a few percent; on a shared 2-core machine one run
of `throughput.py filter` scatters by 15% or more, and separate invocations (each with its
own broker and topic) differ by more than that. So both builds run here against one
broker and one topic, alternating (this, base, base, this, ...: every other pair reversed,
so drift hits both alike), and each pair gives one ratio: this build's rate over the
base's. The table gives every pair and their median.

Each pair gives two ratios: records per second, and CPU microseconds per record of the
worker process (sampled by the worker between its first and its last record). The CPU
figure is the steadier one on a busy machine: other processes take turns from a run, not
instructions from each record.

`--peers` compares the keyshard lane of the peers benchmark instead: 4 worker processes
on a 4-partition topic (Kafka's default producer batching, random keys), the 5 ms I/O
handler, on Apache Kafka; each run's rate is measured over a window after a warm-up, as
in `bench.peers`.

The base is checked out from git into a temporary worktree and its C fast path is built
there; its workers run `python -m bench._worker` from that worktree with this checkout's
interpreter, so they import the base's `keyshard` (the working directory comes first on
the module path) and the same libraries. The worker script itself is this checkout's,
copied over the base's: it is the measuring instrument, not what is measured.

Run: bash scripts/bench.sh ab --base REV [--pairs N] [--records N] [--pure-python] [--peers]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench import RESULTS
from bench._common import KEYS, ROOT, Cluster, RunSpec, cleanup, load_topic, machine, run, workdir
from bench.throughput import LANES
from harness import markdown_table, median


def this_build(part: str, argv: list[str] | None) -> tuple[str, str]:
    """This checkout's name (`git describe`, dirty or not) and the command that runs
    `part` with these arguments, printed with the machine's line before a comparison."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    command = f"bash scripts/bench.sh {part} " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Machine: {machine()}.\nCommand: `{command}`.\n", flush=True)
    return head, command


def checkout(rev: str, where: Path) -> Path:
    """A worktree of `rev` with its C fast path built in place."""
    tree = where / "base"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(tree), rev], check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    shutil.copy(ROOT / "bench" / "_worker.py", tree / "bench" / "_worker.py")
    return tree


def remove(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])


#: The peers benchmark's keyshard lane, measured as `bench.peers` does: a warm-up from
#: the first completed record (the group forms and the lanes fill), then a window.
PEERS_WARMUP_S = 3.0
PEERS_WINDOW_S = 8.0


def workload(cluster: Cluster, records: int, *, peers: bool, pure_python: bool) -> RunSpec:
    """The topic, loaded once, and the run both builds repeat on it."""
    if not peers:
        load_topic(cluster.bootstrap, "noop-p1", 1, records, KEYS)
        return RunSpec(
            "keyshard", "noop-p1", records, handler="noop", concurrency=LANES,
            warmup_s=0.0, window_s=600.0, pure_python=pure_python,
        )  # fmt: skip
    load_topic(cluster.bootstrap, "io-p4", 4, records, KEYS, batching="default", random_keys=True)
    return RunSpec(
        "keyshard", "io-p4", records, processes=4, handler="io", concurrency=LANES,
        warmup_s=PEERS_WARMUP_S, window_s=PEERS_WINDOW_S, pure_python=pure_python,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--pairs", type=int, default=12, help="runs of each build (default 12)")
    parser.add_argument(
        "--records", type=int, default=0,
        help="records in the topic (default 1,600,000; with --peers 400,000)",
    )  # fmt: skip
    parser.add_argument("--pure-python", action="store_true", help="both without the C path")
    parser.add_argument("--tag", default="", help="appended to the output file's name")
    parser.add_argument(
        "--peers", action="store_true",
        help="the peers benchmark's keyshard lane (4 processes, 4 partitions, 5 ms I/O, Kafka)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.records = args.records or (400_000 if args.peers else 1_600_000)
    head, command = this_build("ab", argv)
    work = workdir()
    tree = Path(tempfile.mkdtemp(prefix="keyshard-ab-"))
    try:
        base = checkout(args.base, tree)
        builds = {head: ROOT, args.base: base}
        with Cluster(work, "kafka" if args.peers else "tansu") as cluster:
            spec = workload(cluster, args.records, peers=args.peers, pure_python=args.pure_python)
            rates: dict[str, list[float]] = {name: [] for name in builds}
            cpu: dict[str, list[float]] = {name: [] for name in builds}
            for pair in range(args.pairs):
                order = list(builds) if pair % 2 == 0 else list(reversed(builds))
                for name in order:
                    result = run(cluster, replace(spec, root=builds[name]))
                    rates[name].append(result.rate)
                    cpu[name].append(result.cpu_us_per_record)
                    print(
                        f"pair {pair + 1} {name}: {result.rate:,.0f} rec/s, "
                        f"{result.cpu_us_per_record:.2f} CPU us/record {result.error}",
                        flush=True,
                    )
        ours, theirs = head, args.base
        rate_ratios = [a / b for a, b in zip(rates[ours], rates[theirs], strict=True)]
        cpu_ratios = [a / b if b else 0.0 for a, b in zip(cpu[ours], cpu[theirs], strict=True)]
        rows: list[list[object]] = [
            [i + 1, f"{rates[ours][i]:,.0f}", f"{rates[theirs][i]:,.0f}", f"{rate_ratios[i]:.3f}",
             f"{cpu[ours][i]:.2f}", f"{cpu[theirs][i]:.2f}", f"{cpu_ratios[i]:.3f}"]
            for i in range(args.pairs)
        ]  # fmt: skip
        rows.append(
            ["median", f"{median(rates[ours]):,.0f}", f"{median(rates[theirs]):,.0f}",
             f"{median(rate_ratios):.3f}", f"{median(cpu[ours]):.2f}",
             f"{median(cpu[theirs]):.2f}", f"{median(cpu_ratios):.3f}"]
        )  # fmt: skip
        path = "pure Python loop" if args.pure_python else "C fast path"
        what = (
            f"{args.records:,} records, 5 ms I/O handler, 4 processes of {LANES} lanes on 4 "
            f"partitions, rate over {PEERS_WINDOW_S:.0f} s after {PEERS_WARMUP_S:.0f} s "
            f"({path}), Apache Kafka"
            if args.peers
            else f"{args.records:,} records, no-op handler, one consumer owning every slot "
            f"({path}), Tansu"
        )
        header = [
            "pair", f"{ours} rec/s", f"{theirs} rec/s", "rate ratio",
            f"{ours} CPU us/record", f"{theirs} CPU us/record", "CPU ratio",
        ]  # fmt: skip
        table = (
            f"Machine: {machine()}.\nCommand: `{command}`; {what}.\n\n"
            + markdown_table(header, rows)
            + "\n"
        )
        stem = "ab" + (f"-{args.tag}" if args.tag else "")
        (RESULTS / f"{stem}.md").write_text(table)
        print(table)
    finally:
        remove(tree / "base")
        cleanup(tree)
        cleanup(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
