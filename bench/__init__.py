"""The benchmarks: each script runs as a module from the repository root
(`python -m bench.throughput ...`, or `bash scripts/bench.sh PART`), and every one writes
its tables, JSON and plots into `RESULTS`, apart from the code."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
