#!/usr/bin/env bash
# Set up on a fresh machine and run every test lane runnable here (see platforms/ and ci/):
# cpu (Torch, NumPy, runtime), paddle, and xla-cpu, each in its own virtual env. Lanes whose
# hardware is missing (cuda, tpu, xpu, npu) are reported as skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 ci/matrix.py "$@"
