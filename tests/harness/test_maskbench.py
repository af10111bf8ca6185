"""MaskBench on a CI-sized sample, through the CLI: the runtime must behave exactly like the
raw library it wraps, schema by schema."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from portable_guided.cli import main


def _data_dir() -> Path | None:
    here = Path(__file__).resolve().parents[2]
    for cand in (os.environ.get("PORTABLE_GUIDED_MASKBENCH"), here.parent / "shared/data/maskbench",
                 Path("/work/shared/data/maskbench")):
        if cand and Path(cand, "Github_easy.jsonl").exists():
            return Path(cand)
    return None


DATA = _data_dir()


@pytest.mark.skipif(DATA is None, reason="MaskBench data (shared/data/maskbench) not found")
def test_maskbench_sample_matches_raw_libraries(tmp_path):
    out = tmp_path / "mb.json"
    files = ",".join(str(DATA / f) for f in ("Github_easy.jsonl", "Glaiveai2K.jsonl"))
    rc = main(["bench", "maskbench", files, "--limit", "4", "--engine", "xgrammar,llguidance",
               "--raw", "xgrammar,llguidance", "--timeout", "20", "--json", str(out), "--quiet"])
    assert rc == 0
    res = json.loads(out.read_text())
    s = res["summary"]
    for key in ("schemas", "compiled", "compile_errors", "timeouts", "passing", "valid_ok",
                "invalid_ok", "compile_ms_p50", "compile_ms_p90", "compile_ms_p99",
                "mask_us_mean", "mask_us_p50", "mask_us_p99", "tokens"):
        assert key in s, key
    assert s["schemas"] == 8 == len(res["per_schema"])
    assert s["compiled"] + s["compile_errors"] + s["timeouts"] == 8
    assert 0 < s["valid_ok"] + s["invalid_ok"] <= s["tests"]
    by_mode = {res["mode"]: res["per_schema"], **res["per_schema_by_mode"]}
    for engine in ("xgrammar", "llguidance"):
        ours = [(r["id"], r["status"], r["valid_ok"], r["invalid_ok"])
                for r in by_mode[f"runtime:{engine}"]]
        raw = [(r["id"], r["status"], r["valid_ok"], r["invalid_ok"])
               for r in by_mode[f"raw:{engine}"]]
        assert ours == raw, engine
        assert res["modes"][f"runtime:{engine}"]["tokens"] == res["modes"][f"raw:{engine}"]["tokens"]


def test_bad_arguments(tmp_path, capsys):
    rc = main(["bench", "maskbench", "x.jsonl", "--engine", "nope", "--json", str(tmp_path / "o")])
    assert rc == 2 and "unknown engine" in capsys.readouterr().err
