"""``portable-guided generate``: guided generation with the embedded SmolLM2 model.

Runs the real runner (PyTorch or Paddle) on the detected device, constrains every output with
the grammar runtime and ``apply_token_mask``, validates each output independently (JSON with
``jsonschema``, a regex by full match, a choice by membership, EBNF by replaying the tokens
through a fresh matcher) and prints a timing summary. With no grammar option it uses the
bundled example schema and prompt. Exit status 1 if any output fails validation.

    portable-guided generate                       # the bundled example
    portable-guided generate --schema s.json --prompt "A user profile" --batch 4
    portable-guided generate --regex '[0-9]{3}-[0-9]{4}' --framework paddle
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

__all__ = ["register", "run"]

_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
EXAMPLE_SCHEMA = os.path.join(_DATA, "example_schema.json")
EXAMPLE_PROMPT = os.path.join(_DATA, "example_prompt.txt")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``generate`` subcommand."""
    p = subparsers.add_parser(
        "generate", help="guided generation with the embedded model, outputs validated",
        description=__doc__.split("\n\n")[0],
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--schema", metavar="FILE", help="JSON schema file")
    g.add_argument("--regex", metavar="R", help="regular expression the output must match")
    g.add_argument("--ebnf", metavar="FILE", help="EBNF grammar file (GBNF, root rule 'root')")
    g.add_argument("--choice", metavar="A,B,...", help="comma-separated alternatives")
    g.add_argument("--free", action="store_true", help="no constraint (for comparison)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT", help="the user message")
    src.add_argument("--prompt-file", metavar="FILE", help="one prompt per line")
    p.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda, gpu:0 (default: best)")
    p.add_argument("--batch", type=int, default=1,
                   help="max batch; a single prompt is repeated this many times")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--engine", choices=("auto", "xgrammar", "llguidance"), default="auto")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative", type=int, default=0, metavar="K",
                   help="verify K prompt-lookup draft tokens per step")
    p.add_argument("--draft-branches", type=int, default=1, metavar="B",
                   help="with --speculative: merge up to B draft continuations into a tree")
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--overlap", dest="overlap", action="store_true", default=None,
                    help="fill masks during the forward (default on accelerators)")
    ov.add_argument("--no-overlap", dest="overlap", action="store_false",
                    help="fill masks after the forward (default when the model runs on the CPU)")
    p.add_argument("--compact", action="store_true", help="JSON without free whitespace")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _grammar(args: argparse.Namespace) -> tuple[Any, str, Any]:
    """(GrammarSpec or None, kind, validation target)."""
    import json

    from portable_guided.runtime import GrammarSpec

    if args.free:
        return None, "free", None
    if args.regex is not None:
        return GrammarSpec.regex(args.regex), "regex", args.regex
    if args.ebnf is not None:
        with open(args.ebnf) as f:
            text = f.read()
        return GrammarSpec.ebnf(text), "ebnf", text
    if args.choice is not None:
        choices = [c for c in args.choice.split(",") if c]
        if not choices:
            raise ValueError(f"--choice needs at least one alternative, got {args.choice!r}")
        return GrammarSpec.choice(choices), "choice", choices
    path = args.schema or EXAMPLE_SCHEMA
    with open(path) as f:
        schema = json.load(f)
    return GrammarSpec.json_schema(schema, any_whitespace=not args.compact), "json", schema


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        prompts = [args.prompt]
    elif args.prompt_file is not None:
        with open(args.prompt_file) as f:
            prompts = [line.strip() for line in f if line.strip()]
    else:
        with open(EXAMPLE_PROMPT) as f:
            prompts = [f.read().strip()]
    if not prompts:
        raise ValueError("no prompts given")
    if len(prompts) == 1 and args.batch > 1:
        prompts = prompts * args.batch
    return prompts


def validate(kind: str, target: Any, text: str, ids: list[int], runtime: Any, spec: Any) -> str:
    """``"ok"`` or why ``text`` does not satisfy the constraint (independently checked)."""
    import json
    import re

    if kind == "free":
        return "ok"
    if kind == "json":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), target)
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            return f"invalid JSON: {str(exc).splitlines()[0]}"
        return "ok"
    if kind == "regex":
        return "ok" if re.fullmatch(target, text) else f"does not fully match {target!r}"
    if kind == "choice":
        return "ok" if text in target else f"not one of {target}"
    # EBNF: replay the tokens and the stop token through a fresh matcher.
    req = runtime.new_request(spec, on_error="reject").wait()
    if req.failed:
        return f"grammar failed: {req.error}"
    if req.accept_tokens(ids) != len(ids) or not req.accept(runtime.info.stop_token_ids[0]):
        return "rejected by a fresh matcher"
    return "ok"


def run(args: argparse.Namespace) -> int:
    """Entry point of ``portable-guided generate``."""
    from portable_guided.cli import UsageError

    if args.batch < 1 or args.max_tokens < 1:
        raise UsageError(f"--batch and --max-tokens must be >= 1, got {args.batch}, "
                         f"{args.max_tokens}")
    if args.speculative < 0 or args.draft_branches < 1:
        raise UsageError(f"--speculative must be >= 0 and --draft-branches >= 1, got "
                         f"{args.speculative}, {args.draft_branches}")
    from portable_guided.decode.device import SamplingParams
    from portable_guided.decode.engine import GenerationRequest, Generator
    from portable_guided.runners import load_runner
    from portable_guided.runners.weights import encode_chat
    from portable_guided.runtime import GrammarRuntime

    t_load = time.perf_counter()
    spec, kind, target = _grammar(args)
    prompts = _prompts(args)
    runtime = GrammarRuntime("smollm2", engine=args.engine)
    runner = load_runner(args.framework, device=args.device)
    tok = runner.tokenizer
    load_s = time.perf_counter() - t_load

    requests = [
        GenerationRequest(
            encode_chat(tok, p), args.max_tokens,
            runtime.new_request(spec) if spec is not None else None, i,
        )
        for i, p in enumerate(prompts)
    ]
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests) * args.max_tokens, unit="tok", file=sys.stderr,
                   desc="generating", leave=False)
    done = [0]

    def on_step(tokens: int) -> None:
        if bar is not None:
            bar.update(tokens - done[0])
            done[0] = tokens

    gen = Generator(
        runner, runtime=runtime, overlap=args.overlap, max_batch=min(args.batch, 64),
        num_draft=args.speculative, draft_branches=args.draft_branches, on_step=on_step,
        sampling=SamplingParams(args.temperature, args.top_p, args.seed),
    )
    outs = gen.generate(requests)
    if bar is not None:
        bar.close()

    failures = 0
    for out, prompt in zip(outs, prompts):
        text = tok.decode(out.token_ids)
        if out.finish_reason == "error":
            verdict = f"error: {out.error}"
        elif out.finish_reason == "length":
            verdict = f"cut at --max-tokens {args.max_tokens}"
        else:
            verdict = validate(kind, target, text, out.token_ids, runtime, spec)
        failures += verdict != "ok"
        mark = "valid" if verdict == "ok" else "INVALID"
        print(f"[{out.request_id}] {mark} ({kind}, {len(out.token_ids)} tokens"
              f"{'' if verdict == 'ok' else ': ' + verdict})")
        print(text)
    s = gen.stats
    firsts = sorted(o.first_token_s for o in outs if o.first_token_s is not None)
    ttft = firsts[len(firsts) // 2] if firsts else float("nan")
    device = getattr(runner, "device", None) or "cpu"
    print(
        f"-- {len(outs)} outputs, {len(outs) - failures} valid | {args.framework} on {device}, "
        f"engine {args.engine} | load {load_s:.1f} s | time to first token {ttft:.2f} s (median) | "
        f"{s.output_tokens} tokens in {s.wall_s:.2f} s = {s.tokens_per_s:.1f} tok/s | "
        f"grammar work {100 * s.grammar_s / s.wall_s if s.wall_s else 0:.1f}% of step time, "
        f"visible {100 * s.grammar_share:.1f}%"
        + (f" | drafts accepted {s.accepted_draft_tokens}/{s.draft_tokens}"
           if args.speculative else "")
    )
    runtime.close()
    return 1 if failures else 0
