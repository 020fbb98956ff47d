#!/usr/bin/env bash
# Sets up and runs every check: ruff, mypy, the import contracts (the layer rule, no
# cycles), dead code, the docs build, then the whole pytest suite (unit tests and
# integration tests against real brokers, consumers and a real coordinator).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# The dashboard test drives Debian's chromium through Playwright (no browser download).
# Only root can install it; otherwise tests/api/test_dashboard.py skips and says why.
if [ "$(id -u)" = 0 ]; then
  command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
fi
# Apache Kafka for the tests that run on it too, from Maven Central (cached after the
# first run). Without Java or Maven those tests skip, except under CI=true.
.venv/bin/python -m harness.brokers.kafka
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The layer rule: the import contracts in pyproject.toml.
.venv/bin/lint-imports --no-cache
# Dead code; what vulture cannot see being used is in scripts/vulture_allowlist.py.
.venv/bin/vulture
# The documentation site: any warning fails, a broken link or anchor between pages
# included (external links are not checked: the build runs offline).
site_dir="$(mktemp -d)"
.venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir"
rm -rf "$site_dir"
exec .venv/bin/pytest -p no:cacheprovider "$@"
