#!/usr/bin/env bash
# Issue 22: every CUDA path once on a lent GPU machine, in one call of the device tool:
#   bash scripts/gpu_session.sh                  # every step
#   bash scripts/gpu_session.sh tests decode     # some: tests general decode apply profile jax
#
# Needs, carried beside the repo: .whl/ (xgrammar 0.2.8 and the pure-Python packages the image
# lacks) and .gpu/ (smollm2/: SmolLM2's config and tokenizer, `export_smollm2_hf(dir,
# weights=False)`; maskbench/: the first 64 lines of two MaskBench files). The SmolLM2 GGUF is
# over the tool's transfer limit, so the runner test and the decode benchmark use random
# weights of its shapes (same forward cost, not the model's tokens).
# Writes run.log and the benchmarks' JSON to $OUT. Every step has its own time limit, so a
# hang costs that step only.
set -u
OUT=${OUT:-/tmp/gpu-out}
STEPS=" ${*:-tests general decode apply profile jax} "
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
step() { echo; echo "=== $* ($(date -u +%T))"; }
want() { [[ "$STEPS" == *" $1 "* ]]; }

step setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 - <<'PY'
import importlib.metadata as m, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for p in ("triton", "xgrammar", "llguidance", "jax", "jaxlib", "numpy", "transformers"):
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, "missing")
PY
# xgrammar's `cuda` backend builds its extension on first use: build it while the tests run.
(python3 -c "import time, torch; t = time.time(); import xgrammar.kernels.apply_token_bitmask_inplace_cuda; print(f'xgrammar cuda kernel built in {time.time() - t:.0f} s')" > "$OUT/xgr_cuda_build.log" 2>&1 &)

if want tests; then
  step "pytest: CUDA tests (runner with random SmolLM2-shaped weights)"
  PG_RUNNER_MODEL_FOLDER=.gpu/smollm2 timeout 240 python3 -m pytest -p no:cacheprovider -q -rs \
      -m cuda -k "${PG_TESTS_K:-not nothing}" tests/test_cuda.py tests/runners/test_cuda_runners.py
  echo "pytest cuda rc=$?"
fi

if want general; then
  step "pytest: the device-independent apply tests, with a GPU present"
  timeout 120 python3 -m pytest -p no:cacheprovider -q -x tests/test_errors.py \
      tests/test_registry.py tests/test_dlpack.py tests/test_devices.py tests/test_parity.py
  echo "pytest general rc=$?"
fi

if want decode; then
  step "bench_decode: real forward on the GPU, random weights; sync count"
  timeout 120 python3 bench/bench_decode.py --device torch --cuda --model-folder .gpu/smollm2 \
      --maskbench .gpu/maskbench --count-syncs --json "$OUT/decode_cuda.json" \
      ${DECODE_ARGS:---batches 1 8 32 --tokens 48 --repeat 3}
  echo "bench_decode rc=$?"
fi

if want apply; then
  step "bench_apply --device cuda"
  cat "$OUT/xgr_cuda_build.log"
  timeout 200 python3 bench/bench_apply.py --device cuda --budget 0.1 --min-reps 20 \
      --json "$OUT/apply_cuda.json" ${APPLY_ARGS:-}
  echo "bench_apply rc=$?"
fi

if want profile; then
  step "profile: host time of one apply call, ours (device bitmask) vs xgrammar's Triton call"
  timeout 60 python3 - <<'PY'
import cProfile, pstats, time, torch, xgrammar as xgr, portable_guided as pg
logits = torch.randn(64, 151936, device="cuda")
mask = torch.full((64, 4748), -1, dtype=torch.int32, device="cuda")
calls = {"ours": lambda: pg.apply_token_mask(logits, mask),
         "xgr-triton": lambda: xgr.apply_token_bitmask_inplace(logits, mask, backend="triton")}
for name, fn in calls.items():
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(2000): fn()
    torch.cuda.synchronize()
    print(f"{name}: {(time.perf_counter() - t) / 2000 * 1e6:.1f} us per call (2000 calls)")
profile = cProfile.Profile(); profile.enable()
for _ in range(2000): calls["ours"]()
profile.disable(); torch.cuda.synchronize()
pstats.Stats(profile).sort_stats("tottime").print_stats(18)
PY
  echo "profile rc=$?"
fi

if want jax; then
  step "JAX on its CUDA backend: tests, benchmark"
  JAX_PLATFORMS=cuda timeout 100 python3 -m pytest -p no:cacheprovider -q -rs tests/jax_platform
  echo "pytest jax rc=$?"
  # Per call waited for, then 10 calls back to back (dispatch overlapped with the GPU: the
  # steady-state cost a decode loop sees); "kernels" in the JSON counts launches per variant.
  JAX_PLATFORMS=cuda timeout 60 python3 bench/bench_jax.py --rounds 15 --batches 8,64,256 \
    --vocabs 151936 --json "$OUT/jax_cuda.json"
  echo "bench_jax rc=$?"
  JAX_PLATFORMS=cuda timeout 60 python3 bench/bench_jax.py --rounds 15 --batches 8,64,256 \
    --vocabs 151936 --chain 10 --json "$OUT/jax_cuda_chain10.json"
  echo "bench_jax chain rc=$?"
fi
step done
