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

The base is checked out from git into a temporary worktree and its C fast path is built
there; its workers run `python -m bench._worker` from that worktree with this checkout's
interpreter, so they import the base's `keyshard` (the working directory comes first on
the module path) and the same libraries. The worker script itself is this checkout's,
copied over the base's: it is the measuring instrument, not what is measured.

Run: bash scripts/bench.sh ab --base REV [--pairs N] [--records N] [--pure-python]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--pairs", type=int, default=12, help="runs of each build (default 12)")
    parser.add_argument("--records", type=int, default=1_600_000)
    parser.add_argument("--pure-python", action="store_true", help="both without the C path")
    parser.add_argument("--tag", default="", help="appended to the output file's name")
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    command = "bash scripts/bench.sh ab " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Machine: {machine()}.\nCommand: `{command}`.\n", flush=True)
    work = workdir()
    tree = Path(tempfile.mkdtemp(prefix="keyshard-ab-"))
    try:
        base = checkout(args.base, tree)
        builds = {head: ROOT, args.base: base}
        with Cluster(work, "tansu") as cluster:
            load_topic(cluster.bootstrap, "noop-p1", 1, args.records, KEYS)
            spec = RunSpec(
                "keyshard", "noop-p1", args.records, handler="noop", concurrency=LANES,
                warmup_s=0.0, window_s=600.0, pure_python=args.pure_python,
            )  # fmt: skip
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
        header = [
            "pair", f"{ours} rec/s", f"{theirs} rec/s", "rate ratio",
            f"{ours} CPU us/record", f"{theirs} CPU us/record", "CPU ratio",
        ]  # fmt: skip
        table = (
            f"Machine: {machine()}.\nCommand: `{command}`; {args.records:,} records, no-op "
            f"handler, one consumer owning every slot ({path}), Tansu.\n\n"
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
