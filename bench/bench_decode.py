"""Time per output token: unconstrained vs guided without overlap vs guided with overlap.

Two devices, chosen with ``--device``:

* ``simulated`` (default): :class:`SimulatedRunner`, whose forward takes ``--forward-ms`` of
  device time while leaving the CPU free, so the grammar work's visibility is measured cleanly
  on a small CPU. Masking and argmax run for real on NumPy logits.
* ``torch`` / ``paddle``: the real SmolLM2 runner on this machine's CPU (or ``--cuda``).
  ``--model-folder DIR`` (Torch; ``export_smollm2_hf(DIR, weights=False)``) runs the same
  forward with random weights of SmolLM2's shapes, for a GPU machine the GGUF cannot reach:
  the step costs are the model's, the tokens are not.

Each cell runs ``--tokens`` decode steps for a batch of requests over MaskBench JSON schemas
(xgrammar through the runtime), repeated ``--repeat`` times; the table shows the median time
per step and per output token and the *visible grammar overhead*: how much longer a guided
step is than an unconstrained one, as a share of the guided step.

    python bench/bench_decode.py --json bench/results/decode_simulated.json
    python bench/bench_decode.py --device torch --tokens 24 --json bench/results/decode_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from portable_guided.decode.engine import GenerationRequest, Generator

MODES = ("unconstrained", "guided-serial", "guided-overlap")


def load_schemas(directory: str, count: int) -> list[dict]:
    """The first ``count`` schemas of MaskBench Glaiveai2K then Github_easy."""
    out: list[dict] = []
    for name in ("Glaiveai2K", "Github_easy"):
        with open(os.path.join(directory, f"{name}.jsonl")) as f:
            for line in f:
                out.append(json.loads(line)["schema"])
                if len(out) == count:
                    return out
    return out


def make_runner(args: argparse.Namespace):
    if args.device == "simulated":
        from portable_guided.decode.simulated import SimulatedRunner

        return SimulatedRunner(49152, 2, args.forward_ms / 1000.0)
    from portable_guided.runners import load_runner

    dev = ("cuda" if args.device == "torch" else "gpu") if args.cuda else "cpu"
    if args.model_folder:
        if args.device != "torch":
            raise SystemExit("--model-folder needs --device torch")
        from portable_guided.runners.torch_runner import TorchRunner

        return TorchRunner.with_random_weights(args.model_folder, device=dev)
    return load_runner(args.device, device=dev)


def run_cell(runner, rt, specs, prompt, batch: int, mode: str, tokens: int) -> dict:
    from portable_guided.runtime import GrammarSpec

    guided = mode != "unconstrained"
    reqs = []
    for i in range(batch):
        grammar = None
        if guided:
            grammar = rt.new_request(GrammarSpec.json_schema(specs[i % len(specs)],
                                                             any_whitespace=False))
            grammar.wait()
        reqs.append(GenerationRequest(prompt, tokens, grammar, i))
    gen = Generator(runner, runtime=rt if guided else None, max_batch=batch,
                    overlap=mode == "guided-overlap")
    gen.generate(reqs)
    s = gen.stats
    return {
        "step_ms": 1000 * s.wall_s / max(s.steps, 1),
        "ms_per_token": 1000 * s.wall_s / max(s.output_tokens, 1),
        "grammar_ms_per_step": 1000 * s.grammar_s / max(s.steps, 1),
        "visible_grammar_ms_per_step": 1000 * s.visible_grammar_s / max(s.steps, 1),
        "steps": s.steps,
        "output_tokens": s.output_tokens,
    }


def count_syncs(runner, rt, specs, prompt, batch: int, tokens: int) -> dict:
    """Synchronizing CUDA calls (torch's sync debug mode, as warnings) in one overlapped guided
    run after a warm one, grouped by the Python line that made them."""
    import collections
    import warnings

    import torch

    run_cell(runner, rt, specs, prompt, batch, "guided-overlap", tokens)  # warm
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cell = run_cell(runner, rt, specs, prompt, batch, "guided-overlap", tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sync = [w for w in caught if "synchroniz" in str(w.message)]
    callers = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in sync)
    return {"batch": batch, "steps": cell["steps"], "total": len(sync),
            "by_caller": dict(callers.most_common())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("simulated", "torch", "paddle"), default="simulated")
    p.add_argument("--cuda", action="store_true", help="real runner on the GPU")
    p.add_argument("--forward-ms", type=float, default=20.0, help="simulated forward time")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=48, help="max tokens per request")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--maskbench", default=os.environ.get("PG_MASKBENCH_DIR",
                                                         "/work/shared/data/maskbench"))
    p.add_argument("--fill-threads", type=int, default=2)
    p.add_argument("--model-folder", help="random weights of this folder's model (see above)")
    p.add_argument("--count-syncs", action="store_true",
                   help="with --cuda: one more overlapped run under torch's sync debug mode, "
                        "counting the synchronizing CUDA calls per step and where they are")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    from portable_guided.runners.weights import encode_chat, load_tokenizer
    from portable_guided.runtime import GrammarRuntime, load_tokenizer_info

    runner = make_runner(args)
    tokenizer = getattr(runner, "tokenizer", None) or load_tokenizer()
    info = "smollm2"
    if args.model_folder:
        info = load_tokenizer_info(tokenizer, vocab_size=runner.vocab_size,
                                   stop_token_ids=[runner.eos_token_id])
    rt = GrammarRuntime(info, engine="xgrammar", fill_threads=args.fill_threads)
    specs = load_schemas(args.maskbench, max(args.batches))
    prompt = encode_chat(tokenizer, "Reply with a short JSON object.")
    run_cell(runner, rt, specs, prompt, min(args.batches), "guided-overlap", 4)  # warm up

    rows = []
    print(f"device={args.device} forward_ms={args.forward_ms if args.device == 'simulated' else '-'}"
          f" tokens={args.tokens} repeat={args.repeat} (medians)")
    print(f"{'batch':>5} {'mode':>15} {'step ms':>9} {'ms/token':>9} {'grammar ms':>10}"
          f" {'visible ms':>10} {'overhead':>9}")
    for batch in args.batches:
        cells = {m: [] for m in MODES}
        for _ in range(args.repeat):
            for mode in MODES:  # interleaved, so drifting machine load hits all modes alike
                cells[mode].append(run_cell(runner, rt, specs, prompt, batch, mode, args.tokens))
        med = {m: {k: statistics.median(c[k] for c in cells[m]) for k in cells[m][0]}
               for m in MODES}
        base = med["unconstrained"]["step_ms"]
        for mode in MODES:
            m = med[mode]
            m["visible_overhead_share"] = max(0.0, (m["step_ms"] - base) / m["step_ms"])
            rows.append({"batch": batch, "mode": mode, **m})
            print(f"{batch:>5} {mode:>15} {m['step_ms']:>9.2f} {m['ms_per_token']:>9.2f}"
                  f" {m['grammar_ms_per_step']:>10.2f} {m['visible_grammar_ms_per_step']:>10.2f}"
                  f" {100 * m['visible_overhead_share']:>8.1f}%")
    syncs = None
    if args.cuda and args.count_syncs:
        syncs = count_syncs(runner, rt, specs, prompt, max(args.batches), args.tokens)
        print(f"synchronizing CUDA calls in an overlapped run: {syncs['total']} over "
              f"{syncs['steps']} steps; by caller: {syncs['by_caller']}")
    if args.json:
        from importlib.metadata import version

        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{host_platform.machine()} {os.cpu_count()} cores",
            "python": host_platform.python_version(), "numpy": version("numpy"),
            "xgrammar": version("xgrammar"), "torch": version("torch"),
            "device": args.device, "cuda": args.cuda,
            "gpu": _gpu_name() if args.cuda else None,
            "weights": "random (SmolLM2 shapes)" if args.model_folder else "SmolLM2 GGUF",
            "forward_ms": args.forward_ms if args.device == "simulated" else None,
            "tokens": args.tokens, "repeat": args.repeat, "fill_threads": args.fill_threads,
            "schemas": "MaskBench Glaiveai2K (first N), xgrammar, compact JSON",
            "overhead": "(guided step - unconstrained step) / guided step, medians",
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "syncs": syncs}, f, indent=1)
    rt.close()
    return 0


def _gpu_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"


if __name__ == "__main__":
    sys.exit(main())
