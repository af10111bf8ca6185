"""Compile latency as a serving engine sees it: deadlines counted from submission, the
compile after a worker kill, and an adversarial burst (pathological specs submitted together
with benign ones). Used by ``bench/bench_latency.py`` and ``tests/runtime/test_latency.py``.

Everything goes through :class:`~portable_guided.runtime.GrammarRuntime`'s public API, so the
same code measures any version of the runtime.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..runtime import GrammarRuntime, GrammarSpec, TokenizerInfo

__all__ = ["BurstResult", "DeadlineResult", "benign_schemas", "measure_burst",
           "measure_deadline", "nested_any_of", "pathological_spec", "percentiles",
           "solo_seconds", "warm_runtime"]

_unique = itertools.count()


def pathological_spec(tag: str = "", alternatives: int = 100_000) -> GrammarSpec:
    """A spec no engine compiles in seconds: a choice of ``alternatives`` strings (both
    engines spend seconds on 100,000). ``tag`` makes its key new (no cache can answer)."""
    tag = tag or f"p{next(_unique)}"
    return GrammarSpec.choice([f"{tag}-{i:06d}-opt" for i in range(alternatives)])


def nested_any_of(depth: int, salt: int = 0) -> dict[str, Any]:
    """A small JSON schema whose compile time grows about 2.5-3x a level (xgrammar: depth 8
    about 30 s on 2 cores, depth 12 minutes; llguidance: depth 11 0.55 s, depth 12 refused
    as too large); ``salt`` makes each one new."""
    s: dict[str, Any] = {"type": "string", "pattern": f"^[a-z]{{1,{5 + salt}}}$"}
    for i in range(depth):
        s = {"anyOf": [
            {"type": "object", "properties": {f"k{i}": s, "x": {"type": "integer", "minimum": i}},
             "required": [f"k{i}"]},
            {"type": "array", "items": s, "minItems": 1, "maxItems": 3}]}
    return s


def benign_schemas(path: str | Path, count: int, *, max_chars: int = 4000) -> list[Any]:
    """The first ``count`` object schemas of a MaskBench file with at most ``max_chars`` of
    JSON text (small real-world schemas: each compiles in milliseconds to a few hundred)."""
    out: list[Any] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            schema = json.loads(line)["schema"]
            if isinstance(schema, dict) and len(json.dumps(schema)) <= max_chars:
                out.append(schema)
                if len(out) == count:
                    break
    return out


def _retagged(schema: Any, tag: str) -> GrammarSpec:
    """``schema`` as a spec with a new key (an annotation that no engine reads)."""
    return GrammarSpec.json_schema({**schema, "$comment": f"latency {tag}"})


def solo_seconds(rt: GrammarRuntime, schemas: Sequence[Any], tag: str) -> list[float]:
    """Each schema's time from submission to ready, compiled alone on ``rt``."""
    out = []
    for schema in schemas:
        t0 = time.perf_counter()
        rt.new_request(_retagged(schema, tag)).wait(600)
        out.append(time.perf_counter() - t0)
    return out


@dataclass
class DeadlineResult:
    """How long a pathological compile took to resolve, from submission."""

    engine: str
    limit_s: float
    resolved_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Submission to ready of a trivial spec submitted right after each time-out.
    next_compile_s: list[float] = field(default_factory=list)


def measure_deadline(rt: GrammarRuntime, repeats: int = 3) -> DeadlineResult:
    """Submit a pathological spec ``repeats`` times on a warm ``rt``; record when each
    resolved and how soon a trivial compile submitted right after it was ready."""
    limit = rt._service.timeout_s
    if limit is None:
        raise ValueError("measure_deadline needs a runtime with a compile time limit")
    result = DeadlineResult(rt.engine, limit)
    for _ in range(repeats):
        t0 = time.perf_counter()
        req = rt.new_request(pathological_spec()).wait(10 * limit + 60)
        result.resolved_s.append(time.perf_counter() - t0)
        result.errors.append(type(req.error).__name__ if req.failed else "compiled")
        t1 = time.perf_counter()
        rt.new_request(GrammarSpec.regex(f"[0-9]+q{next(_unique)}")).wait(60)
        result.next_compile_s.append(time.perf_counter() - t1)
    return result


@dataclass
class BurstResult:
    """An adversarial burst: every request's time from submission to resolution."""

    engine: str
    limit_s: float
    benign_solo_s: list[float]
    benign_s: list[float]
    benign_failed: int
    pathological_s: list[float]
    pathological_outcomes: list[str]

    def benign_over_target(self) -> list[int]:
        """Benign requests not ready within 2x their solo time + 0.5 s (indices)."""
        return [i for i, (solo, got) in enumerate(zip(self.benign_solo_s, self.benign_s))
                if got > 2 * solo + 0.5]

    def pathological_over_deadline(self) -> list[int]:
        """Pathological requests not resolved within 1.25x the limit + 0.2 s (indices)."""
        return [i for i, got in enumerate(self.pathological_s)
                if got > 1.25 * self.limit_s + 0.2]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["benign_over_target"] = self.benign_over_target()
        out["pathological_over_deadline"] = self.pathological_over_deadline()
        return out


def measure_burst(rt: GrammarRuntime, schemas: Sequence[Any], solo_s: Sequence[float],
                  pathological: int = 8, tag: str = "burst") -> BurstResult:
    """Submit ``pathological`` pathological specs and the benign ``schemas`` at once (the
    pathological ones first: the worst order for a first-come queue) on a warm ``rt``;
    wait for all."""
    limit = rt._service.timeout_s
    if limit is None:
        raise ValueError("measure_burst needs a runtime with a compile time limit")
    bad = [pathological_spec(f"{tag}{next(_unique)}") for _ in range(pathological)]
    good = [_retagged(s, tag) for s in schemas]
    submitted: list[tuple[Any, float]] = []
    for spec in [*bad, *good]:
        submitted.append((rt.new_request(spec), time.perf_counter()))
    done_at: dict[int, float] = {}
    while len(done_at) < len(submitted):
        for i, (req, _) in enumerate(submitted):
            if i not in done_at and req.ready:
                done_at[i] = time.perf_counter()
        time.sleep(0.002)
    elapsed = [done_at[i] - t for i, (_, t) in enumerate(submitted)]
    reqs = [req for req, _ in submitted]
    return BurstResult(
        engine=rt.engine, limit_s=limit, benign_solo_s=list(solo_s),
        benign_s=elapsed[pathological:],
        benign_failed=sum(r.failed for r in reqs[pathological:]),
        pathological_s=elapsed[:pathological],
        pathological_outcomes=[type(r.error).__name__ if r.failed else "compiled"
                               for r in reqs[:pathological]])


def warm_runtime(info: TokenizerInfo, engine: str, limit_s: float,
                 **kwargs: Any) -> GrammarRuntime:
    """A runtime whose workers and engines are up (a first compile done)."""
    rt = GrammarRuntime(info, engine, compile_timeout_s=limit_s, **kwargs)
    rt.new_request(GrammarSpec.regex(f"a+{next(_unique)}")).wait(300)
    return rt


def percentiles(values: Iterable[float]) -> dict[str, float]:
    """p50/p90/p99/max of ``values`` (seconds)."""
    import numpy as np

    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {}
    return {f"p{q}": float(np.percentile(arr, q)) for q in (50, 90, 99)} | {
        "max": float(arr.max())}
