#!/usr/bin/env bash
# Sets up and runs every check: ruff, mypy, then the whole pytest suite (unit tests and
# integration tests against real brokers, consumers and a real coordinator).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest -p no:cacheprovider "$@"
