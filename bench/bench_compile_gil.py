"""Compile latency of the runtime while another Python thread holds the GIL (as vLLM's busy
engine loop does while requests wait for their grammars).

A cache-miss compile goes to a worker process and back; each call in this process that
releases the GIL (the pool's reader waiting for the reply, the engine's recompile, the
matcher) must win it back from the busy thread, which Python hands over only every switch
interval (5 ms by default). Session 8 measured 12.8 ms (busy) vs 2.9 ms (idle) with a
thread per compile; session 9's single reader thread: 8-13 ms vs 2.2-4.5 ms (noisy: load
2-4 from other jobs). Measured in turn on small new Glaiveai2K schemas:
no busy thread, a busy thread at the default interval, a busy thread at 0.5 ms.

    python bench/bench_compile_gil.py --json bench/results/compile_gil_s8.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (("idle", False, 0.005), ("busy thread, 5 ms interval", True, 0.005),
         ("busy thread, 0.5 ms interval", True, 0.0005))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-case", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    from bench.bench_vllm import schemas
    from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
    from portable_guided.runtime.engines import compile_checked, create_engine

    info = load_tokenizer_info("smollm2")
    check = create_engine("xgrammar", info)
    pool = []
    for schema in schemas(16 + 3 * args.rounds * args.per_case * 2)[16:]:
        try:  # only schemas the runtime compiles (ours refuses a few keywords)
            compile_checked(check, GrammarSpec.json_schema(schema, strict=True))
        except Exception:  # noqa: BLE001, S112 - refused: not a compile to time
            continue
        pool.append(schema)
    need = len(CASES) * args.rounds * args.per_case + 1
    if len(pool) < need:
        raise ValueError(f"{len(pool)} compilable schemas, {need} needed")
    runtime = GrammarRuntime(info, compile_timeout_s=30, compile_workers=1)
    runtime.new_request(GrammarSpec.json_schema(pool.pop(), strict=True)).wait()
    stop = threading.Event()

    def busy() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    latencies: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for _ in range(args.rounds):
        for name, spinning, interval in CASES:
            sys.setswitchinterval(interval)
            stop.clear()
            thread = threading.Thread(target=busy, daemon=True)
            if spinning:
                thread.start()
            for _ in range(args.per_case):
                spec = GrammarSpec.json_schema(pool.pop(), strict=True)
                start = time.perf_counter()
                runtime.new_request(spec, on_error="reject").wait()
                latencies[name].append((time.perf_counter() - start) * 1e3)
            stop.set()
            if spinning:
                thread.join()
    sys.setswitchinterval(0.005)
    runtime.close()
    summary = {name: {"ms_p50": statistics.median(v), "n": len(v)}
               for name, v in latencies.items()}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime()),
            "command": " ".join(sys.argv), "load_average": os.getloadavg(),
            "what": "ms from new_request to ready for a new small schema (cache miss: the "
                    "worker compiles, this process recompiles), xgrammar, SmolLM2 tokenizer, "
                    "1 compile worker; cases interleaved per round", "summary": summary},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
