#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs keyshard with the given extras. Idempotent:
# re-running only installs what changed. Usage: scripts/setup.sh [extras, default "server"]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-server}"
python_bin="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "keyshard needs Python 3.11 (found $("$python_bin" --version 2>&1) at $python_bin)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
stamp=".venv/.keyshard-installed-$extras"
# setup.py and the C source: the editable install compiles consumer_client/_datapath/_fastpath.c
# into the checkout, so a changed .c needs the install to run again.
newer=0
for f in pyproject.toml setup.py consumer_client/_datapath/_fastpath.c; do
  if [ "$f" -nt "$stamp" ]; then newer=1; fi
done
if [ ! -f "$stamp" ] || [ "$newer" = 1 ]; then
  echo "installing keyshard[$extras] into .venv (log: .venv/setup.log)"
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e ".[$extras]"; } > .venv/setup.log 2>&1; then
    tail -n 40 .venv/setup.log >&2
    echo "setup failed: see .venv/setup.log" >&2
    exit 1
  fi
  .venv/bin/python -c 'import keyshard.coordinator, keyshard.consumer_client, keyshard.api'
  touch "$stamp"
fi
