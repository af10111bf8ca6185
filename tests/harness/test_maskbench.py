"""MaskBench on a CI-sized sample, through the CLI, and the raw baselines: the libraries
called on the user's schema as vLLM calls them."""

from __future__ import annotations

import json

import pytest
from maskbench_data import maskbench_dir

from portable_guided.cli import main

DATA = maskbench_dir()


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
    for mode in ("runtime:xgrammar", "runtime:llguidance", "raw:xgrammar", "raw:llguidance"):
        assert [r["id"] for r in by_mode[mode]] == [r["id"] for r in res["per_schema"]], mode


def test_raw_modes_call_the_libraries_on_the_users_schema():
    """Raw baselines are what vLLM gets: xgrammar's strict_mode forbids undeclared
    properties and it reads an overlapping oneOf as anyOf; llguidance refuses that oneOf.
    The runtime does neither (one JSON-schema language; exclusive oneOf branches)."""
    from portable_guided.harness.maskbench import run_mode
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("smollm2")
    records = [
        {"id": "open", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
         "tests": [{"valid": True, "data": {"a": 1, "b": 2}}]},
        {"id": "oneOf", "schema": {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
         "tests": [{"valid": False, "data": 3}, {"valid": True, "data": 1}]},
    ]
    ok = {mode: [(r["valid_ok"], r["invalid_ok"]) for r in
                 run_mode(mode, records, info, timeout_s=20)["per_schema"]]
          for mode in ("raw:xgrammar", "raw:llguidance", "runtime:auto", "race:auto")}
    assert ok["raw:xgrammar"] == [(0, 0), (1, 0)]  # strict; 3 (both branches) accepted
    assert ok["raw:llguidance"] == [(1, 0), (0, 0)]  # oneOf refused without coerce_one_of
    assert ok["runtime:auto"] == ok["race:auto"] == [(1, 0), (1, 1)]


def test_modes_taking_turns_decide_as_modes_run_alone():
    """``ModeRun`` fed schema by schema, two modes alive and alternating (the benchmark's
    ``--interleave``), decides every instance as ``run_mode`` does and fills as many masks:
    only when each mask is timed changes."""
    from portable_guided.harness.maskbench import ModeRun, run_mode
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("smollm2")
    records = [
        {"id": "open", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
         "tests": [{"valid": True, "data": {"a": 1, "b": 2}}]},
        {"id": "int", "schema": {"type": "integer", "minimum": 3},
         "tests": [{"valid": True, "data": 7}, {"valid": False, "data": 1}]},
        {"id": "bad", "schema": {"type": "nonsense"}, "tests": [{"valid": True, "data": 1}]},
    ]
    modes = ("raw:xgrammar", "runtime:auto")
    runs = {mode: ModeRun(mode, info, timeout_s=20) for mode in modes}
    try:
        for rec in records:
            for mode in modes[::1 if rec["id"] != "int" else -1]:
                runs[mode].add(rec)
    finally:
        for run in runs.values():
            run.close()
    keys = ("id", "status", "tests", "tests_ok", "valid_ok", "invalid_ok", "tokens")
    for mode in modes:
        alone = run_mode(mode, records, info, timeout_s=20)
        taking_turns = runs[mode].result()
        assert ([{k: r.get(k) for k in keys} for r in taking_turns["per_schema"]]
                == [{k: r.get(k) for k in keys} for r in alone["per_schema"]]), mode
        assert len(taking_turns["mask_times"]) == len(alone["mask_times"]) > 0
        assert taking_turns["summary"]["passing"] == alone["summary"]["passing"]
    assert [r["valid_ok"] for r in runs["raw:xgrammar"].per_schema][:2] == [0, 1]  # strict
    assert [r["status"] for r in runs["runtime:auto"].per_schema] == ["ok", "ok",
                                                                      "compile_error"]


def test_warm_pass_records_each_schemas_slowest_masks():
    """With a warm pass, each schema's row says which engine served it then, its slowest
    warm mask and how many took over 100 us (what makes the tail)."""
    from portable_guided.harness.maskbench import run_mode
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("smollm2")
    records = [{"id": "obj", "schema": {"type": "object", "properties": {
        "a": {"type": "integer"}}}, "tests": [{"valid": True, "data": {"a": 12}}]}]
    result = run_mode("runtime:auto", records, info, timeout_s=20, warm_wait_s=5)
    row = result["per_schema"][0]
    walked = len(result["warm_mask_times"])
    assert walked == len(info.encode('{"a": 12}')) + 1
    assert row["warm_mask_us_max"] == round(max(result["warm_mask_times"]) * 1e6, 1)
    assert row["warm_masks_over_100us"] == sum(t > 100e-6 for t in result["warm_mask_times"])
    assert row["warm_engine"] in ("xgrammar", "llguidance")


def test_first_request_masks_are_attributed_to_the_engine_that_served_them():
    """Each first-request mask is recorded with the engine that filled it: ``auto`` starts a
    request on llguidance; the per-engine counts add up to all masks, and each schema's row
    names its slowest mask."""
    from portable_guided.harness.maskbench import mask_engines, run_mode
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("smollm2")
    records = [{"id": "obj", "schema": {"type": "object", "properties": {
        "a": {"type": "integer"}}}, "tests": [{"valid": True, "data": {"a": 12}},
                                            {"valid": False, "data": {"a": "x"}}]}]
    result = run_mode("runtime:auto", records, info, timeout_s=20)
    served, times = result["served_by"], result["mask_times"]
    assert len(served) == len(times) > 0 and set(served) == {"llguidance"}
    engines = result["summary"]["mask_engines"]
    assert engines["llguidance"]["masks"] == len(times)
    assert result["per_schema"][0]["mask_us_max"] == round(max(times) * 1e6, 1)
    # Attribution by an exact example: the slowest 1% of five masks is the slowest one.
    split = mask_engines([1e-6, 2e-6, 3e-6, 4e-6, 9e-6], ["a", "a", "b", "b", "b"])
    assert split["a"]["masks"] == 2 and split["b"]["masks"] == 3
    assert split["b"]["in_overall_top_1pct"] == 1 and split["a"]["in_overall_top_1pct"] == 0


def test_pace_sleeps_after_every_token_in_raw_modes_too():
    """``pace_s`` is the same decode step for every mode: a raw mode (no upgrade to wait
    for) sleeps after each token as well."""
    import time

    from portable_guided.harness.maskbench import run_mode
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("smollm2")
    records = [{"id": "int", "schema": {"type": "integer"},
                "tests": [{"valid": True, "data": 123456789}]}]
    tokens = len(info.encode("123456789")) + 1
    start = time.perf_counter()
    result = run_mode("raw:xgrammar", records, info, timeout_s=20, pace_s=0.05)
    assert len(result["mask_times"]) == tokens
    assert time.perf_counter() - start >= tokens * 0.05


def test_bad_arguments(tmp_path, capsys):
    rc = main(["bench", "maskbench", "x.jsonl", "--engine", "nope", "--json", str(tmp_path / "o")])
    assert rc == 2 and "unknown engine" in capsys.readouterr().err
