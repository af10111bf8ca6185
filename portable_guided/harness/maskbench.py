"""MaskBench: compile each schema, then walk each test instance token by token, filling a
mask before every token; valid instances must be accepted to the end (stop token included),
invalid ones rejected somewhere.

Modes: ``runtime:<engine>`` goes through :class:`GrammarRuntime` (``engine`` is xgrammar,
llguidance or auto; ``noprewarm:<engine>`` the same without the runtime's start-up prewarm);
``raw:xgrammar`` and ``raw:llguidance`` call the libraries on the
user's schema as vLLM does (``Engine.compile_raw``: xgrammar's ``compile_json_schema`` with its
default ``strict_mode``, llguidance's JSON-schema grammar with its defaults; none of our
lowering or refusals), compiled in the same killable worker, so a pathological schema cannot
hang the run; the compile time reported for raw modes is the library call alone, measured in
the worker.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..runtime.engines import engine_class
from ..runtime.errors import (
    GrammarCompileError,
    GrammarEmptyLanguage,
    GrammarSpecError,
    GrammarTimeout,
)
from ..runtime.runtime import GrammarRuntime
from ..runtime.specs import GrammarSpec
from ..runtime.tokenizer_info import TokenizerInfo
from ..runtime.worker import WorkerPool

__all__ = ["MODES", "ModeRun", "load_records", "run_mode", "summarize", "summary_table", "write_results"]

MODES = ("runtime:xgrammar", "runtime:llguidance", "runtime:auto", "raw:xgrammar",
         "raw:llguidance", "race:auto", "noprewarm:auto")


def load_records(paths: Sequence[str], limit: int | None = None) -> list[dict[str, Any]]:
    """MaskBench records from JSONL files (the first ``limit`` of each file)."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            n = 0
            for line in fh:
                if not line.strip():
                    continue
                if limit is not None and n >= limit:
                    break
                out.append(json.loads(line))
                n += 1
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


class _Walker:
    """Per-mode compile + mask + accept primitives."""

    def __init__(self, mode: str, info: TokenizerInfo, timeout_s: float,
                 upgrade: bool = False) -> None:
        self.mode = mode
        self.info = info
        self.timeout_s = timeout_s
        kind, engine = mode.split(":")
        self.kind, self.engine = kind, engine
        self.rt: GrammarRuntime | None = None
        self.pool: WorkerPool | None = None
        if kind in ("runtime", "race", "noprewarm"):
            # Engine upgrades only where the run measures them (the warm pass): otherwise
            # every instance of an `auto` spec is decided by the engine auto chose. "race":
            # compiles in this process (``compile_race=True``, the vLLM and SGLang backends');
            # "noprewarm": the runtime without its start-up prewarm (``engine_prewarm``).
            self.rt = GrammarRuntime(info, engine, compile_timeout_s=timeout_s, fill_threads=1,
                                     failure_ttl_s=0, engine_upgrade=upgrade,
                                     compile_race=kind == "race",
                                     engine_prewarm=kind != "noprewarm")
        elif kind == "raw":
            self.pool = WorkerPool(
                lambda: {engine: engine_class(engine).tokenizer_payload(info)}, size=1)
            # Raw modes call the libraries themselves; only the tokenizer conversion is ours.
            if engine == "xgrammar":
                import xgrammar as xgr

                from ..runtime.engines import xgrammar as xgr_engine

                self._xgr = xgr
                self._xinfo = xgr_engine.tokenizer(info)
            else:
                import llguidance as llg
                import llguidance.numpy as llg_np

                from ..runtime.engines import llguidance as llg_engine

                self._llg, self._llg_np = llg, llg_np
                self._ltok = llg_engine.tokenizer(info)
        else:
            raise ValueError(f"unknown mode {mode!r}; known: {MODES}")

    def close(self) -> None:
        if self.rt is not None:
            self.rt.close()
        if self.pool is not None:
            self.pool.close()

    def compile(self, spec: GrammarSpec) -> tuple[Any, float]:
        """(compiled handle, compile seconds); raises GrammarCompileError/GrammarTimeout."""
        if self.rt is not None:
            t0 = time.perf_counter()
            compiled = self.rt.compile(spec)
            return compiled, time.perf_counter() - t0
        assert self.pool is not None
        status, text, seconds = self.pool.run(f"raw:{self.engine}", spec.to_dict(),
                                              self.timeout_s, serialize="always")
        if status != "ok":
            raise GrammarCompileError(str(text), engine=self.engine)
        if self.engine == "xgrammar":
            return self._xgr.CompiledGrammar.deserialize_json(text, self._xinfo), seconds
        return text, seconds

    def settle(self, spec: GrammarSpec, wait_s: float) -> str:
        """Wait up to ``wait_s`` for ``spec``'s engine upgrade, if one runs (runtime modes);
        the engine later requests of ``spec`` get."""
        if self.rt is None:
            return f"raw:{self.engine}"
        deadline = time.monotonic() + wait_s
        while self.rt.upgrade_state(spec) == "running" and time.monotonic() < deadline:
            time.sleep(0.005)
        return str(self.rt.compile(spec).engine_name)

    def walk(self, spec: GrammarSpec, compiled: Any, ids: list[int], bm: np.ndarray,
             mask_times: list[float], step_s: float = 0.0,
             served_by: list[str] | None = None, pace_s: float = 0.0) -> bool:
        """True if every token and then the stop token were allowed and accepted.

        ``step_s``: after each token, sleep this long while ``spec``'s engine upgrade runs
        (runtime modes), as a server's decode step would pass on the device between two
        masks; once it has ended, time passing changes nothing, so the walk goes on at
        once. ``pace_s``: after each token, sleep this long in every mode, whatever runs
        (a server's decode step, the same for every mode: a mask after an idle wait costs
        several times one right after another on this machine). ``served_by``: the engine
        of each mask is appended there (runtime modes: the request's engine when it filled
        the mask, which changes once an upgrade lands)."""
        stop = self.info.stop_token_ids[0]
        perf = time.perf_counter
        # Each branch binds the mode's own fill and accept (different signatures).
        fill: Callable[..., Any]
        accept: Callable[[int], Any]
        engine_of: Callable[[], str | None] = lambda: self.mode
        if self.rt is not None:
            req = self.rt.new_request(spec, on_error="reject")
            fill, accept = req.fill, req.accept
            engine_of = lambda: req.engine_name
        elif self.engine == "xgrammar":
            m = self._xgr.GrammarMatcher(compiled)
            fill, accept = m.fill_next_token_bitmask, m.accept_token
        else:
            lm = self._llg.LLMatcher(self._ltok, compiled, log_level=0)
            np_fill = self._llg_np.fill_next_token_bitmask

            def llg_fill(bitmask: np.ndarray, row: int = 0) -> None:
                np_fill(lm, bitmask, row)

            def llg_accept(t: int) -> bool:
                if t == stop:
                    return bool(lm.is_accepting())
                return bool(lm.consume_token(t))

            fill, accept = llg_fill, llg_accept
        stepping = self.rt if step_s > 0 else None  # (raw modes: nothing to wait for)
        for t in [*ids, stop]:
            t0 = perf()
            fill(bm, 0)
            mask_times.append(perf() - t0)
            if served_by is not None:
                served_by.append(str(engine_of()))
            if not (int(bm[0, t >> 5]) >> (t & 31)) & 1:
                return False
            if not accept(t):
                return False
            if pace_s > 0:
                time.sleep(pace_s)
            elif stepping is not None:
                if stepping.upgrade_state(spec) == "running":
                    time.sleep(step_s)
                else:
                    stepping = None
        return True


def run_mode(mode: str, records: Iterable[dict[str, Any]], info: TokenizerInfo, *,
             timeout_s: float = 30.0, progress: Any = None,
             warm_wait_s: float | None = None, step_s: float = 0.0,
             pace_s: float = 0.0) -> dict[str, Any]:
    """Run one mode over ``records``; returns ``{"summary": ..., "per_schema": [...],
    "mask_times": [...]}`` (:class:`ModeRun`, whose arguments these are). ``progress``:
    called with each schema's row."""
    run = ModeRun(mode, info, timeout_s=timeout_s, warm_wait_s=warm_wait_s, step_s=step_s,
                  pace_s=pace_s)
    try:
        for rec in records:
            row = run.add(rec)
            if progress is not None:
                progress(row)
    finally:
        run.close()
    return run.result()


class ModeRun:
    """One mode's MaskBench run, fed one schema at a time (:meth:`add`), so that a benchmark
    can interleave modes schema by schema: then a slow spell of a shared machine falls on
    every mode alike, not on whichever mode ran a file during it.

    ``warm_wait_s``: runtimes with engine upgrades on (``CompileService(upgrade=True)``),
    and after a schema's tests its valid instances walked once more as later requests of
    the same schema (``"warm_mask_times"``: the steady state a server sees for a schema it
    serves repeatedly; ``warm_valid_rejected`` per schema), after waiting up to this long for
    the upgrade to settle; raw modes walk their own grammar again. Without it, upgrades are
    off: every instance of an ``auto`` spec is decided by the engine ``auto`` chose.
    ``step_s``, ``pace_s``: the first requests' decode step (``_Walker.walk``)."""

    def __init__(self, mode: str, info: TokenizerInfo, *, timeout_s: float = 30.0,
                 warm_wait_s: float | None = None, step_s: float = 0.0,
                 pace_s: float = 0.0) -> None:
        self.mode, self.info = mode, info
        self.warm_wait_s, self.step_s, self.pace_s = warm_wait_s, step_s, pace_s
        self.per_schema: list[dict[str, Any]] = []
        self.compile_times: list[float] = []
        self.mask_times: list[float] = []
        self.served_by: list[str] = []  # the engine of each first-request mask
        self.warm_times: list[float] = []
        self._bm = np.full((1, info.bitmask_words), -1, dtype=np.int32)
        self._walker = _Walker(mode, info, timeout_s, upgrade=warm_wait_s is not None)
        # Warm up: the first compile waits for the worker process to start.
        try:
            self._walker.compile(GrammarSpec.json_schema({"type": "integer"}))
        except GrammarCompileError:
            pass
        except BaseException:
            self._walker.close()
            raise

    def close(self) -> None:
        """Stop the mode's runtime or worker."""
        self._walker.close()

    def result(self) -> dict[str, Any]:
        """``{"summary", "served_by", "per_schema", "mask_times", "warm_mask_times"}``."""
        summary = summarize(self.per_schema, self.compile_times, self.mask_times, records=None)
        summary["mask_engines"] = mask_engines(self.mask_times, self.served_by)
        return {"summary": summary, "served_by": self.served_by,
                "per_schema": self.per_schema, "mask_times": self.mask_times,
                "warm_mask_times": self.warm_times}

    def add(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Compile ``rec``'s schema and walk its tests; returns the schema's row."""
        walker, info, bm = self._walker, self.info, self._bm
        mask_times, served_by = self.mask_times, self.served_by
        row: dict[str, Any] = {"id": rec.get("id"), "status": "ok", "tests": 0,
                               "tests_ok": 0, "valid_ok": 0, "invalid_ok": 0}
        self.per_schema.append(row)
        try:
            # Raw modes take the schema as the library would: no checks of ours.
            spec = GrammarSpec.json_schema(rec["schema"], validate=walker.kind != "raw")
            compiled, seconds = walker.compile(spec)
        except GrammarTimeout as exc:
            row.update(status="timeout", error=str(exc)[:200])
            return row
        except GrammarEmptyLanguage as exc:
            # Refused as accepting no value: every instance is rejected.
            invalid = sum(not t["valid"] for t in rec.get("tests", []))
            row.update(status="empty", error=str(exc)[:200],
                       tests=len(rec.get("tests", [])), tests_ok=invalid,
                       invalid_ok=invalid)
            return row
        except (GrammarCompileError, GrammarSpecError) as exc:
            row.update(status="compile_error", error=str(exc)[:200])
            return row
        self.compile_times.append(seconds)
        row["compile_ms"] = round(seconds * 1e3, 3)
        first_mask = len(mask_times)
        for test in rec.get("tests", []):
            text = json.dumps(test["data"], indent=None, ensure_ascii=False)
            ids = info.encode(text)
            accepted = walker.walk(spec, compiled, ids, bm, mask_times, self.step_s,
                                   served_by, self.pace_s)
            ok = accepted == bool(test["valid"])
            row["tests"] += 1
            row["tests_ok"] += ok
            if test["valid"]:
                row["valid_ok"] += ok
            else:
                row["invalid_ok"] += ok
            row["tokens"] = row.get("tokens", 0) + len(ids) + 1
        # Which schemas and engines make the first requests' tail.
        mine = mask_times[first_mask:]
        if mine:
            row["mask_us_max"] = round(max(mine) * 1e6, 1)
            slow = Counter(e for t, e in zip(mine, served_by[first_mask:]) if t > 200e-6)
            row["masks_over_200us"] = dict(slow)
        if self.warm_wait_s is not None:
            row["warm_engine"] = walker.settle(spec, self.warm_wait_s)
            row["warm_valid_rejected"] = 0
            first = len(self.warm_times)
            for test in rec.get("tests", []):
                if test["valid"]:
                    ids = info.encode(json.dumps(test["data"], indent=None,
                                                 ensure_ascii=False))
                    row["warm_valid_rejected"] += not walker.walk(spec, compiled, ids, bm,
                                                                  self.warm_times)
            # Which schemas make the tail: their slowest warm mask, and how many
            # took over 100 us.
            mine = self.warm_times[first:]
            if mine:
                row["warm_mask_us_max"] = round(max(mine) * 1e6, 1)
                row["warm_masks_over_100us"] = sum(t > 100e-6 for t in mine)
        return row


def mask_engines(mask_times: Sequence[float], served_by: Sequence[str]) -> dict[str, Any]:
    """Per engine that served first-request masks: how many, p50 and p99 (us), and how many
    of the slowest 1% of all masks it served."""
    if not mask_times:
        return {}
    tail = _pct(list(mask_times), 99)
    by_engine: dict[str, list[float]] = {}
    for t, e in zip(mask_times, served_by):
        by_engine.setdefault(e, []).append(t)
    return {e: {"masks": len(v), "us_p50": round(_pct(v, 50) * 1e6, 1),
                "us_p99": round(_pct(v, 99) * 1e6, 1),
                "in_overall_top_1pct": sum(t >= tail for t in v)}
            for e, v in sorted(by_engine.items())}


def summarize(per_schema: list[dict[str, Any]], compile_times: list[float],
              mask_times: list[float], records: Any = None) -> dict[str, Any]:
    """The summary object of a MaskBench run."""
    compiled = [r for r in per_schema if r["status"] == "ok"]
    return {
        "schemas": len(per_schema),
        "compiled": len(compiled),
        "compile_errors": sum(r["status"] == "compile_error" for r in per_schema),
        "empty": sum(r["status"] == "empty" for r in per_schema),
        "timeouts": sum(r["status"] == "timeout" for r in per_schema),
        "passing": sum(r["status"] in ("ok", "empty") and r["tests_ok"] == r["tests"]
                       for r in per_schema),
        "valid_ok": sum(r["valid_ok"] for r in per_schema),
        "invalid_ok": sum(r["invalid_ok"] for r in per_schema),
        "tests": sum(r["tests"] for r in per_schema),
        "compile_ms_p50": _pct(compile_times, 50) * 1e3,
        "compile_ms_p90": _pct(compile_times, 90) * 1e3,
        "compile_ms_p99": _pct(compile_times, 99) * 1e3,
        "mask_us_mean": (statistics.fmean(mask_times) * 1e6) if mask_times else float("nan"),
        "mask_us_p50": _pct(mask_times, 50) * 1e6,
        "mask_us_p99": _pct(mask_times, 99) * 1e6,
        "tokens": len(mask_times),
    }


def write_results(path: str, payload: dict[str, Any]) -> None:
    """Write a bench's results to ``path`` as JSON: its command line, the date and
    :func:`machine_note`, then ``payload``."""
    import datetime
    import sys

    out = {"command": " ".join(["python", *sys.argv]),
           "date": datetime.date.today().isoformat(), "machine": machine_note(), **payload}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)


def machine_note() -> dict[str, Any]:
    """Where a result was measured (the machine is shared; see the benchmark notes)."""
    import os

    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "note": "2-core machine shared with other engineers"}


def summary_table(modes: dict[str, dict[str, Any]]) -> str:
    """Markdown table of mode summaries: coverage counts, compile and mask time percentiles."""
    counts = ("compiled", "compile_errors", "timeouts", "passing", "valid_ok", "invalid_ok")
    lines = [
        ("| mode | schemas | compiled | compile err | timeouts | passing | valid ok | invalid ok "
         "| compile ms p50 / p90 / p99 | mask us p50 / p99 / mean | masks |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for mode, s in modes.items():
        lines.append(
            f"| {mode.replace(':', ' ')} | {s['schemas']} | "
            + " | ".join(str(s[c]) for c in counts)
            + f" | {s['compile_ms_p50']:.1f} / {s['compile_ms_p90']:.1f} / "
            f"{s['compile_ms_p99']:.0f} | {s['mask_us_p50']:.1f} / {s['mask_us_p99']:.0f} / "
            f"{s['mask_us_mean']:.1f} | {s['tokens']} |"
        )
    return "\n".join(lines)
