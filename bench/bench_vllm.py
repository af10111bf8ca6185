"""vLLM 0.32 (CPU) with and without portable_guided, side by side in one engine.

Modes, interleaved round by round in one in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
so every timer sees every step; synchronous scheduling so a step's parts add up):

- ``off``: vLLM alone (xgrammar backend; its CPU apply converts bf16 logits to fp32 and back
  around xgrammar's kernel);
- ``apply``: our ``apply_grammar_bitmask`` (``apply_token_mask`` in place, in the logits'
  dtype), vLLM's xgrammar backend;
- ``runtime``: our apply and our grammar runtime as the structured-output backend.

Per decode step (steps whose every request decodes one token), medians over the rounds:
the step's wall time, the forward (``execute_model``), the time outside the forward, the
bitmask fill (``StructuredOutputManager.grammar_bitmask``) and the apply; tokens/s over the
whole generate call. Then a kernel replay: the bitmasks vLLM produced at the largest batch
are applied to fresh logits right after an lm_head-sized matmul, vLLM's apply vs ours,
buffers rotated beyond the CPU cache.

Both backends run warm: each keeps its own backend object (and so its compile cache and, for
ours, its started compile workers) across rounds, and round 0 of each batch size warms both.
Until session 7 every mode switch dropped the backend, so our runtime started its compile
worker again in every round while vLLM's xgrammar compiles in threads: tokens/s favoured vLLM.

Then the cold start (``--cold``): requests whose schemas neither backend has seen, B at once
(distinct schemas that both backends compile), time from ``add_request`` to each request's
first token, ours vs vLLM's xgrammar backend, the order alternating per trial. Each
backend's very first request, which also builds the backend (ours: the runtime and its
compile worker processes), is reported apart (``first_request_ms``).

    python bench/bench_vllm.py --json bench/results/vllm_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = ("off", "apply", "runtime")


GLAIVE = Path("/work/shared/data/maskbench/Glaiveai2K.jsonl")


def schemas(n: int, path: Path = GLAIVE, max_chars: int = 600) -> list[dict[str, Any]]:
    """Real schemas of a MaskBench file (default: small Glaiveai2K ones), in file order."""
    out = []
    with path.open() as f:
        for line in f:
            schema = json.loads(line)["schema"]
            if len(json.dumps(schema)) < max_chars:
                out.append(schema)
            if len(out) == n:
                break
    return out


def servable(llm: Any, candidates: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` schemas both backends compile (ours refuses some keywords xgrammar
    would ignore; such a request fails alone and would have no first token). Checked with a
    throwaway engine in this process: neither backend's compiler or cache sees them."""
    from portable_guided.runtime import GrammarSpec, load_tokenizer_info
    from portable_guided.runtime.engines import compile_checked, create_engine

    info = load_tokenizer_info(llm.get_tokenizer(),
                               vocab_size=llm.llm_engine.model_config.get_vocab_size())
    engine = create_engine("xgrammar", info)
    out = []
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import (
        has_xgrammar_unsupported_json_features,
        validate_xgrammar_grammar,
    )

    for schema in candidates:
        try:
            if has_xgrammar_unsupported_json_features(schema):
                raise ValueError("features vLLM's xgrammar backend does not take")
            validate_xgrammar_grammar(SamplingParams(
                structured_outputs=StructuredOutputsParams(json=schema)))
        except Exception as exc:  # noqa: BLE001 - vLLM alone would refuse or reroute it
            print(f"cold pool: skipping a schema vLLM's xgrammar backend refuses "
                  f"({str(exc)[:80]})")
            continue
        try:
            compile_checked(engine, GrammarSpec.json_schema(schema, strict=True))
        except Exception as exc:  # noqa: BLE001 - refused or invalid: not a fair cold request
            print(f"cold pool: skipping a schema ours refuses ({str(exc)[:80]})")
            continue
        out.append(schema)
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} of {len(candidates)} schemas compile; {n} needed")


class StepTimers:
    """Wraps vLLM's forward, fill and apply with timers; one record per engine step."""

    def __init__(self) -> None:
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.v1.structured_output import StructuredOutputManager

        self.gmr, self.som = gmr, StructuredOutputManager
        self.current: dict[str, float] = {}

    def install(self) -> None:
        """Wrap whatever functions are installed now (vLLM's or the plugin's)."""
        runner_cls, gmr, som, cur = self.gmr.GPUModelRunner, self.gmr, self.som, self.current
        self.saved = (runner_cls.execute_model, gmr.apply_grammar_bitmask, som.grammar_bitmask)
        execute, apply, fill = self.saved

        def timed_execute(runner: Any, scheduler_output: Any, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return execute(runner, scheduler_output, *a, **k)
            finally:
                cur["forward"] = cur.get("forward", 0.0) + time.perf_counter() - t
                n_reqs = len(scheduler_output.num_scheduled_tokens)
                cur["decode"] = float(n_reqs > 0 and n_reqs
                                      == scheduler_output.total_num_scheduled_tokens)

        def timed_apply(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return apply(*a, **k)
            finally:
                cur["apply"] = cur.get("apply", 0.0) + time.perf_counter() - t
                cur["rows"] = float(a[3].shape[0])  # logits rows: the batch

        def timed_fill(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                out = fill(*a, **k)
                if out is not None:
                    dumps.append(out.copy())
                return out
            finally:
                cur["fill"] = cur.get("fill", 0.0) + time.perf_counter() - t

        dumps: list[Any] = []
        self.dumps = dumps
        runner_cls.execute_model = timed_execute
        gmr.apply_grammar_bitmask = timed_apply
        som.grammar_bitmask = timed_fill

    def uninstall(self) -> None:
        execute, apply, fill = self.saved
        self.gmr.GPUModelRunner.execute_model = execute
        self.gmr.apply_grammar_bitmask = apply
        self.som.grammar_bitmask = fill


class WarmBackends:
    """Each backend kind (vLLM's own for ``off``/``apply``, ours for ``runtime``) kept across
    rounds: switching modes parks the active backend instead of destroying it."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.parked: dict[str, Any] = {}

    @contextlib.contextmanager
    def mode(self, mode: str) -> Iterator[None]:
        from portable_guided.integrations.vllm import backend
        from tests.vllm_plugin.conftest import manager, set_plugin

        kind = "ours" if mode == "runtime" else "vllm"
        mgr = manager(self.llm)
        set_plugin(mode)
        mgr.backend = self.parked.get(kind)
        mgr._grammar_bitmask = None
        try:
            yield
            if mode == "runtime" and not isinstance(mgr.backend, backend.PortableGuidedBackend):
                raise AssertionError(f"vLLM used {type(mgr.backend).__name__}, not ours")
        finally:
            self.parked[kind] = mgr.backend
            mgr.backend = None
            mgr._grammar_bitmask = None
            set_plugin("off")

    def close(self) -> None:
        for backend in self.parked.values():
            if backend is not None:
                backend.destroy()
        self.parked.clear()


def cold_ttft(llm: Any, warm: WarmBackends, pool: list[dict[str, Any]], batch: int,
              trials: int) -> dict[str, Any]:
    """Time to first token of requests whose schemas the backend has never compiled."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    per_kind: dict[str, list[float]] = {"vllm": [], "ours": []}
    walls: dict[str, list[float]] = {"vllm": [], "ours": []}
    ready_ms: dict[str, list[float]] = {"vllm": [], "ours": []}
    ready_per_trial: dict[str, list[float]] = {"vllm": [], "ours": []}

    def first_tokens(kind: str, fresh: list[dict[str, Any]]) -> list[float]:
        """Submit one request per schema at once; ms from submission to each first token
        (and, in ``ready_ms``, to each grammar's compile future resolving)."""
        with warm.mode("runtime" if kind == "ours" else "off"):
            start = time.perf_counter()
            first: dict[str, float] = {}
            ids = []
            for i, schema in enumerate(fresh):
                rid = f"cold{time.monotonic_ns()}-{i}"
                ids.append(rid)
                engine.add_request(rid, "Return a JSON object:\n", SamplingParams(
                    temperature=0, max_tokens=2,
                    structured_outputs=StructuredOutputsParams(json=schema)))
            for request in scheduler.requests.values():
                future = getattr(request.structured_output_request, "_grammar", None)
                if hasattr(future, "add_done_callback"):  # the compile is still running
                    future.add_done_callback(lambda _, kind=kind: ready_ms[kind].append(
                        (time.perf_counter() - start) * 1e3))
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.outputs and out.outputs[0].token_ids and out.request_id not in first:
                        first[out.request_id] = time.perf_counter() - start
            walls[kind].append(time.perf_counter() - start)
        return [first.get(rid, float("nan")) * 1e3 for rid in ids]

    out: dict[str, Any] = {}
    if any(warm.parked.get(kind) is None for kind in ("vllm", "ours")):
        # Each backend's first request ever also builds the backend (ours: the runtime and
        # its compile workers): reported apart, then both backends are warm.
        out["first_request_ms"] = {kind: first_tokens(kind, [pool[i]])[0]
                                   for i, kind in enumerate(("vllm", "ours"))}
        for lists in (walls, ready_ms):
            lists["vllm"].clear()
            lists["ours"].clear()
        print(f"first request (backend built): {out['first_request_ms']}", flush=True)
    used = 2
    for trial in range(trials):
        fresh = pool[used:used + batch]
        used += batch
        if len(fresh) < batch:
            raise ValueError(f"the schema pool ran out: {len(pool)} schemas for "
                             f"{trials} trials of {batch}")
        for kind in (("vllm", "ours") if trial % 2 == 0 else ("ours", "vllm")):
            seen = len(ready_ms[kind])
            per_kind[kind].extend(first_tokens(kind, fresh))
            ready_per_trial[kind].append(statistics.median(ready_ms[kind][seen:] or [math.nan]))
            print(f"cold B={batch} trial {trial} {kind}: first token median "
                  f"{statistics.median(per_kind[kind][-batch:]):.0f} ms, last "
                  f"{max(per_kind[kind][-batch:]):.0f} ms", flush=True)
    for kind, values in per_kind.items():
        out[kind] = {"ttft_ms_p50": statistics.median(values), "ttft_ms_max": max(values),
                     "batch_wall_ms_p50": statistics.median(walls[kind]) * 1e3,
                     "grammar_ready_ms_p50": statistics.median(ready_ms[kind] or [math.nan]),
                     "grammar_ready_ms_max": max(ready_ms[kind] or [math.nan]),
                     "ttft_ms_p50_per_trial": [statistics.median(values[i:i + batch])
                                               for i in range(0, len(values), batch)],
                     "grammar_ready_ms_p50_per_trial": ready_per_trial[kind]}
    out["ttft_p50_ours_vs_vllm"] = out["ours"]["ttft_ms_p50"] / out["vllm"]["ttft_ms_p50"]
    out["grammar_ready_p50_ours_vs_vllm"] = (out["ours"]["grammar_ready_ms_p50"]
                                             / out["vllm"]["grammar_ready_ms_p50"])
    # Both backends get the same schemas in a trial, one right after the other: the median
    # of the per-trial ratios is less swayed by the load other processes put on the cores.
    for name, field in (("ttft", "ttft_ms_p50_per_trial"),
                        ("grammar_ready", "grammar_ready_ms_p50_per_trial")):
        out[f"{name}_ours_vs_vllm_median_of_trial_ratios"] = statistics.median(
            o / v for o, v in zip(out["ours"][field], out["vllm"][field]))
    return out


def run_once(llm: Any, timers: StepTimers, prompts: list[str], params: list[Any]) -> dict:
    engine = llm.llm_engine
    steps: list[dict[str, float]] = []
    start = time.perf_counter()
    for i, (prompt, param) in enumerate(zip(prompts, params)):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", prompt, param)
    # Wait for every grammar, so the batch is fixed before the first step (the ``grammar``
    # property reads None while a compile runs: ask is_grammar_ready).
    scheduler = engine.engine_core.engine_core.scheduler
    structured = [r.structured_output_request for r in scheduler.requests.values()
                  if r.structured_output_request is not None]
    while not all(s.is_grammar_ready for s in structured):
        time.sleep(0.002)
    outputs: dict[str, Any] = {}
    tokens = 0
    while engine.has_unfinished_requests():
        timers.current.clear()
        t = time.perf_counter()
        outs = engine.step()
        wall = time.perf_counter() - t
        rec = dict(timers.current, step=wall)
        steps.append(rec)
        for out in outs:
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
                tokens += len(out.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    # Decode steps of the full batch (every request decoding; none finished yet).
    decode = [s for s in steps if s.get("decode") and s.get("rows") == len(prompts)]
    med = {key: statistics.median(s.get(key, 0.0) for s in decode) * 1e3
           for key in ("step", "forward", "fill", "apply")} if decode else {}
    if decode:
        med["outside_forward"] = statistics.median(
            (s["step"] - s["forward"]) for s in decode) * 1e3
    return {"ms": med, "decode_steps": len(decode), "tokens_per_s": tokens / elapsed,
            "outputs": [outputs[k] for k in sorted(outputs, key=lambda k: int(k.rsplit("-", 1)[1]))]}


def kernel_replay(dumps: list[Any], vocab: int, dtype: str, reps: int) -> dict[str, Any]:
    """vLLM's apply vs ours on real dumped bitmasks, right after an lm_head-sized matmul."""
    import numpy as np
    import torch
    import vllm.v1.structured_output.utils as vllm_utils
    from vllm.v1.core.sched.output import GrammarOutput

    from portable_guided.integrations.vllm.apply import apply_grammar_bitmask as ours

    theirs = vllm_utils.apply_grammar_bitmask
    from portable_guided.integrations.vllm import is_patched

    if is_patched():  # the original, never the plugin's
        import portable_guided.integrations.vllm as plug

        theirs = plug._original_apply[0]
    masks = [m for m in dumps if m.shape[0] == max(d.shape[0] for d in dumps)]
    rows = masks[0].shape[0]
    torch_dtype = getattr(torch, dtype)
    hidden = torch.randn(rows, 576, dtype=torch_dtype)
    lm_head = torch.randn(576, vocab, dtype=torch_dtype)
    # Rotate logits buffers through more than the CPU's last-level cache.
    n_buf = max(2, (256 << 20) // (rows * vocab * torch.finfo(torch_dtype).bits // 8) + 1)
    buffers = [torch.empty(rows, vocab, dtype=torch_dtype) for _ in range(n_buf)]
    ids = [f"r{i}" for i in range(rows)]
    sched = SimpleNamespace(scheduled_spec_decode_tokens={})
    batch = SimpleNamespace(req_ids=ids)
    times: dict[str, list[float]] = {"vllm": [], "portable_guided": []}
    same = True
    for rep in range(reps):
        for name, fn in (("vllm", theirs), ("portable_guided", ours))[:: 1 if rep % 2 else -1]:
            mask = masks[rep % len(masks)]
            out = buffers[rep % n_buf]
            torch.matmul(hidden, lm_head, out=out)  # the apply runs right after the lm_head
            t = time.perf_counter()
            fn(sched, GrammarOutput(ids, mask, [0] * rows), batch, out)
            times[name].append(time.perf_counter() - t)
        if rep < 4:  # both leave the same logits
            a = torch.matmul(hidden, lm_head)
            b = a.clone()
            theirs(sched, GrammarOutput(ids, mask, [0] * rows), batch, a)
            ours(sched, GrammarOutput(ids, mask, [0] * rows), batch, b)
            same &= bool(torch.equal(a, b))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    allowed = float(np.mean([np.unpackbits(m.view(np.uint8)).mean() for m in masks[:8]]))
    return {"rows": rows, "vocab": vocab, "dtype": dtype, "masks": len(masks),
            "allowed_fraction": allowed, "ms": med,
            "speedup": med["vllm"] / med["portable_guided"], "identical_logits": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--replay-reps", type=int, default=60)
    parser.add_argument("--cold", default="1,64",
                        help="batch sizes of the cold-compile time-to-first-token runs ('' skips)")
    parser.add_argument("--cold-trials", type=int, default=3)
    parser.add_argument("--cold-schemas", type=Path, default=GLAIVE,
                        help="MaskBench JSONL file the cold-start schemas come from (e.g. "
                             "JSONSchemaBench's Github_hard joined into one file)")
    parser.add_argument("--cold-max-chars", type=int, default=600,
                        help="only cold-start schemas with less JSON text than this")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from tests.vllm_plugin.conftest import ENGINE_ARGS, model_dir

    engine_args = dict(ENGINE_ARGS, dtype=args.dtype, max_num_seqs=64,
                       kv_cache_memory_bytes=768 << 20, async_scheduling=False)
    llm = LLM(model=model_dir(), **engine_args)
    timers = StepTimers()
    warm = WarmBackends(llm)
    pool = schemas(16)
    results: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "load_average_at_start": os.getloadavg(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("PORTABLE_GUIDED_VLLM")},
        "engine_args": {k: v for k, v in engine_args.items()}, "runs": {}}
    for batch in [int(b) for b in args.batches.split(",") if b]:
        prompts = [f"Return a JSON object for this schema: {json.dumps(pool[i % len(pool)])[:200]}\n"
                   for i in range(batch)]
        params = [SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=False,
                                 structured_outputs=StructuredOutputsParams(json=pool[i % len(pool)]))
                  for i in range(batch)]
        per_mode: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(args.rounds + 1):  # round 0 warms compiles and caches, not reported
            order = MODES[r % 3:] + MODES[: r % 3]
            for mode in order:
                with warm.mode(mode):
                    timers.install()
                    try:
                        res = run_once(llm, timers, prompts, params)
                    finally:
                        timers.uninstall()
                if r:
                    per_mode[mode].append(res)
                print(f"B={batch} round {r} {mode:8s} " + " ".join(
                    f"{k}={v:.2f}" for k, v in res["ms"].items()) +
                    f" tok/s={res['tokens_per_s']:.1f}", flush=True)
        summary = {}
        for mode, runs in per_mode.items():
            keys = runs[0]["ms"].keys()
            summary[mode] = {k: statistics.median(run["ms"][k] for run in runs) for k in keys}
            summary[mode]["tokens_per_s"] = statistics.median(run["tokens_per_s"] for run in runs)
        identical = all(per_mode[m][i]["outputs"] == per_mode["off"][i]["outputs"]
                        for m in MODES for i in range(args.rounds))
        summary["identical_outputs_each_round"] = identical
        summary["apply_speedup"] = summary["off"]["apply"] / max(summary["apply"]["apply"], 1e-9)
        summary["outside_forward_runtime_vs_off"] = (
            summary["runtime"]["outside_forward"] / summary["off"]["outside_forward"])
        results["runs"][str(batch)] = summary
        print(json.dumps({str(batch): summary}, indent=1), flush=True)
    if args.cold:
        # Schemas never used above (the warm pool is the first 16 small ones).
        cold = [int(b) for b in args.cold.split(",")]
        need = args.cold_trials * sum(cold) + 2 * len(cold)
        candidates = schemas(16 + 2 * need, args.cold_schemas, args.cold_max_chars)
        if args.cold_schemas == GLAIVE:
            candidates = candidates[16:]  # the warm pool's schemas
        fresh = servable(llm, candidates, need)
        results["cold"] = {}
        for batch in cold:
            results["cold"][str(batch)] = cold_ttft(llm, warm, fresh, batch, args.cold_trials)
            fresh = fresh[2 + batch * args.cold_trials:]
            print(json.dumps({f"cold B={batch}": results["cold"][str(batch)]}, indent=1),
                  flush=True)
    warm.close()
    if not getattr(timers, "dumps", None):
        results["kernel_replay"] = None
    else:
        results["kernel_replay"] = kernel_replay(
            timers.dumps, llm.llm_engine.model_config.get_vocab_size(), args.dtype,
            args.replay_reps)
    print(json.dumps(results["kernel_replay"], indent=1))
    results["load_average_at_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
