"""The official JSON Schema Test Suite as a check of ``GrammarSpec.json_schema``.

Each group of the suite (a schema and instances labelled valid or invalid by the JSON
Schema specification) is compiled per engine; each instance is serialized with
``json.dumps``, tokenized, walked token by token through a request (``on_error="reject"``),
then the stop token: the instance is accepted iff every token and the stop are. A schema
that an engine refuses (spec error, compile error, time limit) decides nothing, which is
sound; an accepted invalid instance is the failure structured output exists to prevent.
Used by ``tests/runtime/test_json_schema_suite.py`` and ``bench/json_schema_suite.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime.errors import (
    GrammarCompileError,
    GrammarEmptyLanguage,
    GrammarSpecError,
    GrammarTimeout,
)
from ..runtime.runtime import GrammarRuntime
from ..runtime.specs import GrammarSpec
from ..runtime.tokenizer_info import TokenizerInfo

__all__ = ["load_suite", "run_suite", "summarize_suite"]


def load_suite(folder: str) -> list[dict[str, Any]]:
    """The suite's groups from every ``*.json`` file of ``folder`` (sorted by file name):
    ``{"id": "file.json#i", "description", "schema", "tests"}``."""
    groups = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            for i, group in enumerate(json.load(fh)):
                groups.append({"id": f"{name}#{i}", "description": group["description"],
                               "schema": group["schema"], "tests": group["tests"]})
    return groups


def run_suite(groups: Sequence[dict[str, Any]], info: TokenizerInfo, engine: str, *,
              timeout_s: float | None = 5.0,
              progress: Callable[[dict[str, Any]], None] | None = None
              ) -> list[dict[str, Any]]:
    """One row per group: ``{"id", "status": "ok" | "empty" | "refused" | "timeout", "error",
    "tests": [[valid, accepted], ...]}``: tests where the schema compiled, and where it was
    refused as accepting no value at all ("empty": the runtime then accepts no instance)."""
    # (No engine upgrade: every instance of a group decided by the engine auto chose.)
    rt = GrammarRuntime(info, engine, compile_timeout_s=timeout_s, fill_threads=1,
                        failure_ttl_s=0, engine_upgrade=False)
    stop = info.stop_token_ids[0]
    rows: list[dict[str, Any]] = []
    try:
        for group in groups:
            row: dict[str, Any] = {"id": group["id"], "status": "ok", "tests": [],
                                   "n_tests": len(group["tests"])}
            rows.append(row)
            try:
                spec = GrammarSpec.json_schema(group["schema"])
                rt.compile(spec)
            except GrammarTimeout as exc:
                row.update(status="timeout", error=str(exc)[:300])
            except GrammarEmptyLanguage as exc:
                row.update(status="empty", error=str(exc)[:300],
                           tests=[[bool(t["valid"]), False] for t in group["tests"]])
            except (GrammarCompileError, GrammarSpecError) as exc:
                row.update(status="refused", error=str(exc)[:300])
            else:
                for test in group["tests"]:
                    ids = info.encode(json.dumps(test["data"]))
                    req = rt.new_request(spec, on_error="reject")
                    accepted = req.accept_tokens(ids) == len(ids) and req.accept(stop)
                    row["tests"].append([bool(test["valid"]), bool(accepted)])
            if progress is not None:
                progress(row)
    finally:
        rt.close()
    return rows


def summarize_suite(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts over :func:`run_suite`'s rows: schemas compiled, instances decided right (in
    all, and on the schemas compiled only), invalid instances accepted (must be 0), valid instances rejected, and the ids of the
    groups with an accepted invalid instance."""
    tests = [t for r in rows for t in r["tests"]]
    return {
        "schemas": len(rows),
        "compiled": sum(r["status"] == "ok" for r in rows),
        "empty": sum(r["status"] == "empty" for r in rows),
        "timeouts": sum(r["status"] == "timeout" for r in rows),
        "instances": sum(r["n_tests"] for r in rows),
        "decided_right": sum(valid == accepted for valid, accepted in tests),
        # The same, leaving out the rejections of schemas refused as accepting nothing.
        "decided_right_compiled": sum(valid == accepted for r in rows if r["status"] == "ok"
                                      for valid, accepted in r["tests"]),
        "invalid_accepted": sum(accepted and not valid for valid, accepted in tests),
        "valid_rejected": sum(valid and not accepted for valid, accepted in tests),
        "unsound_groups": [r["id"] for r in rows
                           if any(a and not v for v, a in r["tests"])],
    }
