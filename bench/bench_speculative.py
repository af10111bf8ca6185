"""Speculative guided decoding on the real model: none vs draft chain vs draft tree.

Runs the same guided batch (MaskBench JSON schemas, xgrammar, greedy) three ways and reports
ms per output token, output tokens per forward step, and how many draft tokens were accepted.
Greedy speculative output must be token-identical to the plain run; the script exits 1 if not.

    python bench/bench_speculative.py --json bench/results/speculative_cpu_torch.json
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
sys.path.insert(0, os.path.dirname(__file__))

from bench_decode import load_schemas

from portable_guided.decode.engine import GenerationRequest, Generator

MODES = {
    "plain": {},
    "chain k=4": {"num_draft": 4},
    "tree k=8 b=3": {"num_draft": 8, "draft_branches": 3},
}


def run(runner, rt, schemas, prompt, tokens: int, options: dict) -> tuple[dict, list]:
    from portable_guided.runtime import GrammarSpec

    reqs = [
        GenerationRequest(prompt, tokens,
                          rt.new_request(GrammarSpec.json_schema(s, any_whitespace=False)), i)
        for i, s in enumerate(schemas)
    ]
    for r in reqs:
        r.grammar.wait()
    gen = Generator(runner, runtime=rt, max_batch=len(reqs), **options)
    outs = gen.generate(reqs)
    s = gen.stats
    return {
        "ms_per_token": 1000 * s.wall_s / max(s.output_tokens, 1),
        "tokens_per_step": s.output_tokens / max(s.steps, 1),
        "steps": s.steps,
        "output_tokens": s.output_tokens,
        "draft_tokens": s.draft_tokens,
        "accepted_draft_tokens": s.accepted_draft_tokens,
        "forward_rows": s.forward_rows,
    }, [o.token_ids for o in outs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens", type=int, default=96, help="max tokens per request")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--maskbench", default=os.environ.get("PG_MASKBENCH_DIR",
                                                         "/work/shared/data/maskbench"))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from portable_guided.runners import load_runner
    from portable_guided.runners.weights import encode_chat, load_tokenizer
    from portable_guided.runtime import GrammarRuntime

    rt = GrammarRuntime("smollm2", engine="xgrammar")
    schemas = load_schemas(args.maskbench, max(args.batches))
    prompt = encode_chat(load_tokenizer(), "Reply with a short JSON object.")
    runner = load_runner(args.framework, device=args.device)
    run(runner, rt, schemas[:1], prompt, 4, {})  # warm up

    rows, identical = [], True
    print(f"{args.framework} on {args.device}, up to {args.tokens} tokens, medians of "
          f"{args.repeat}")
    print(f"{'batch':>5} {'mode':>14} {'ms/token':>9} {'tok/step':>9} {'accepted':>14}")
    for batch in args.batches:
        cells: dict[str, list[dict]] = {m: [] for m in MODES}
        ref = None
        for _ in range(args.repeat):
            for mode, options in MODES.items():  # interleaved against load drift
                cell, outs = run(runner, rt, schemas[:batch], prompt, args.tokens, options)
                cells[mode].append(cell)
                if ref is None:
                    ref = outs
                elif outs != ref:
                    identical = False
                    print(f"  ! batch {batch} {mode}: output differs from the plain run")
        for mode in MODES:
            med = {k: statistics.median(c[k] for c in cells[mode]) for k in cells[mode][0]}
            rows.append({"batch": batch, "mode": mode, **med})
            acc = f"{med['accepted_draft_tokens']:.0f}/{med['draft_tokens']:.0f}"
            print(f"{batch:>5} {mode:>14} {med['ms_per_token']:>9.2f} "
                  f"{med['tokens_per_step']:>9.2f} {acc:>14}")
    print("outputs identical to the plain run:", identical)
    if args.json:
        from importlib.metadata import version

        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{host_platform.machine()} {os.cpu_count()} cores",
            "framework": args.framework, "device": args.device, "tokens": args.tokens,
            "repeat": args.repeat, "threads": args.threads or "default",
            "xgrammar": version("xgrammar"),
            "schemas": "MaskBench Glaiveai2K (first N), compact JSON, greedy",
            "identical": identical,
            "command": "python bench/bench_speculative.py " + " ".join(argv or sys.argv[1:]),
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
