#!/usr/bin/env bash
# Set up on a fresh machine and run every test runnable here (GPU tests skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest tests "$@"
