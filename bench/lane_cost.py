"""Instructions per record of the consumer's own data path, this checkout against another
build: a count that holds still whatever else the machine does.

A wall-clock A/B (`bench.ab`) judges a change of a few percent through pairs that scatter
by 10-20% on a shared 2-core machine. Valgrind's callgrind counts the instructions a
process executes instead: the same build, inputs and environment give the same count
within a fraction of a percent, loaded machine or not. The workload
(`bench._lane_workload`) is the real fetch loop and lanes over records already held by a
stand-in client, so the count is keyshard's own per-record work (the broker, the network
and aiokafka's decoding are the same for both builds and left out). A record's cost is
the slope between a run of N records and one of 3N, so start-up (imports, building the
records) cancels out.

- `io`: 4 partitions, 64 lanes, a handler that suspends once: the peers benchmark's path,
  where every record goes through a lane;
- `noop`: one partition, a handler that finishes inline: the filter benchmark's path.

Run: bash scripts/bench.sh lane-cost --base REV [--records N] [--kinds io,noop]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import RESULTS
from bench._common import ROOT, cleanup, machine
from bench.ab import checkout, remove, this_build
from harness import markdown_table

_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(tree: Path, kind: str, records: int) -> int:
    """Instructions executed by one run of the workload in `tree`'s build."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-m", "bench._lane_workload", kind, str(records)],
        cwd=tree, capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind reported no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_record(tree: Path, kind: str, records: int) -> float:
    return (instructions(tree, kind, 3 * records) - instructions(tree, kind, records)) / (
        2 * records
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the build to compare with (a git rev)")
    parser.add_argument("--records", type=int, default=4000, help="N (the runs are N and 3N)")
    parser.add_argument("--kinds", default="io,noop", help="io, noop or both (comma-separated)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is needed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    head, command = this_build("lane-cost", argv)
    tree = Path(tempfile.mkdtemp(prefix="keyshard-lane-cost-"))
    try:
        base = checkout(args.base, tree)
        shutil.copy(ROOT / "bench" / "_lane_workload.py", base / "bench" / "_lane_workload.py")
        rows: list[list[object]] = []
        for kind in args.kinds.split(","):
            ours = per_record(ROOT, kind, args.records)
            theirs = per_record(base, kind, args.records)
            print(f"{kind}: {head} {ours:,.0f}, {args.base} {theirs:,.0f} instructions/record")
            rows.append([kind, f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.3f}"])
        header = ["path", f"{head} instr./record", f"{args.base} instr./record", "ratio"]
        table = (
            f"Machine: {machine()}.\nCommand: `{command}`; callgrind, the slope between "
            f"{args.records:,} and {3 * args.records:,} records (bench._lane_workload).\n\n"
            + markdown_table(header, rows)
            + "\n"
        )
        (RESULTS / "lane-cost.md").write_text(table)
        print(table)
    finally:
        remove(tree / "base")
        cleanup(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
