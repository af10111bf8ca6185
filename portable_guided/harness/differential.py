"""Cross-engine differential on MaskBench instances: does the language of a JSON schema
depend on the engine that compiled it?

For each schema both engines compile, every test instance (serialized as the MaskBench harness
does) is walked token by token through a request of each engine, ending with the stop token;
the two accept/reject decisions must agree. The test's ``valid`` label (the dataset's
JSON Schema verdict) says which engine is right where they differ. Used by
``bench/maskbench_differential.py`` (full split) and ``tests/harness/test_differential.py``
(a committed subset).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime.errors import GrammarCompileError, GrammarSpecError
from ..runtime.runtime import GrammarRuntime
from ..runtime.specs import GrammarSpec
from ..runtime.tokenizer_info import TokenizerInfo

__all__ = ["ENGINES", "compare_engines", "disagreements"]

ENGINES = ("xgrammar", "llguidance")


def compare_engines(records: Sequence[dict[str, Any]], info: TokenizerInfo, *,
                    timeout_s: float | None = 10.0, strict: bool = False,
                    progress: Callable[[dict[str, Any]], None] | None = None
                    ) -> list[dict[str, Any]]:
    """One row per schema: ``{"id", "compiled": {engine: bool}, "error": {engine: str},
    "tests": [[valid, xgrammar_accepts, llguidance_accepts], ...]}`` (tests only where both
    compiled). llguidance compiles first: xgrammar is skipped where it fails (not both).
    ``timeout_s=None`` compiles in this process (no worker, no limit)."""
    rts = {e: GrammarRuntime(info, e, compile_timeout_s=timeout_s, fill_threads=1,
                             failure_ttl_s=0, engine_upgrade=False) for e in ENGINES}
    stop = info.stop_token_ids[0]
    rows: list[dict[str, Any]] = []
    try:
        for rec in records:
            row: dict[str, Any] = {"id": rec.get("id"), "compiled": {}, "error": {}, "tests": []}
            rows.append(row)
            try:
                spec = GrammarSpec.json_schema(rec["schema"], strict=strict)
            except (GrammarSpecError, TypeError) as exc:
                row["error"]["spec"] = str(exc)[:200]
                continue
            for engine in ("llguidance", "xgrammar"):
                try:
                    rts[engine].compile(spec)
                    row["compiled"][engine] = True
                except GrammarCompileError as exc:
                    row["compiled"][engine] = False
                    row["error"][engine] = str(exc)[:300]
                    break
            if len(row["compiled"]) == 2 and all(row["compiled"].values()):
                for test in rec.get("tests", []):
                    ids = info.encode(json.dumps(test["data"], indent=None, ensure_ascii=False))
                    decisions = []
                    for engine in ENGINES:
                        req = rts[engine].new_request(spec, on_error="reject")
                        decisions.append(req.accept_tokens(ids) == len(ids) and req.accept(stop))
                    row["tests"].append([bool(test["valid"]), *decisions])
            if progress is not None:
                progress(row)
    finally:
        for rt in rts.values():
            rt.close()
    return rows


def disagreements(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The schemas whose instances get different decisions, with which engine was right:
    ``{"id", "tests": [index...], "xgrammar_right": n, "llguidance_right": n}``."""
    out = []
    for row in rows:
        differ = [i for i, (_, x, g) in enumerate(row["tests"]) if x != g]
        if differ:
            out.append({"id": row["id"], "tests": differ,
                        "xgrammar_right": sum(row["tests"][i][1] == row["tests"][i][0]
                                              for i in differ),
                        "llguidance_right": sum(row["tests"][i][2] == row["tests"][i][0]
                                                for i in differ)})
    return out
