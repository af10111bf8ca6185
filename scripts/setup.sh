#!/usr/bin/env bash
# Create .venv with everything the main job and the tests need (CPU machine, no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Pin torch first: an unpinned torch would pull the multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[paddle,grammar,test]" "torch==2.13.0"
