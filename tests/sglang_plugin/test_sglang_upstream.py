"""SGLang's own CPU unit tests for constrained decoding, run with our plugin loaded.

SGLang's wheel ships no unit tests, and CI reaches package registries only, so they come
from a checkout of SGLang's repository at the release matching the installed SGLang
(``test/registered/unit/constrained``: the tests SGLang registers for its CPU suite), named
by ``PORTABLE_GUIDED_SGLANG_TESTS``; without it these tests skip. Nothing of SGLang's is
copied into this repository.

The check: each of SGLang's tests has the same outcome with our plugin loaded as without it
(a test of a newer SGLang than the installed one may fail both ways: that is SGLang's
version skew, not ours), and the plugin did take over in the loaded run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ENV_TESTS = "PORTABLE_GUIDED_SGLANG_TESTS"
HERE = Path(__file__).parent


def _upstream() -> Path:
    value = os.environ.get(ENV_TESTS)
    if not value:
        pytest.skip(f"{ENV_TESTS} is not set: SGLang's unit tests are not in its wheel; point "
                    "it at test/registered/unit/constrained of an SGLang checkout of the "
                    "installed release")
    path = Path(value)
    if not path.is_dir() or not list(path.glob("test_*.py")):
        raise FileNotFoundError(f"{ENV_TESTS}={value!r} holds no test_*.py files")
    return path


def _outcomes(tests: Path, out: Path, plugin: bool) -> tuple[dict[str, str], str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]))
    env["SGLANG_PLUGINS"] = "portable_guided" if plugin else ""
    report = out / f"{'on' if plugin else 'off'}.xml"
    # Not check=True: some of SGLang's tests may fail; outcomes are compared, not exit codes.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tests), "-p", "upstream_loader",
         "-p", "no:cacheprovider", f"--junit-xml={report}", "--rootdir", str(tests)],
        env=env, capture_output=True, text=True, timeout=900, cwd=tests, check=False)
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else
                          "skipped" if "skipped" in kinds else "passed")
    return outcomes, done.stdout


def test_sglang_unit_tests_have_the_same_outcomes_with_the_plugin(tmp_path):
    tests = _upstream()
    off, _ = _outcomes(tests, tmp_path, plugin=False)
    on, log = _outcomes(tests, tmp_path, plugin=True)
    assert "taken over ['llguidance', 'xgrammar', 'xgrammar_static'], patched True" in log
    assert off, "SGLang's tests collected nothing"
    changed = {name: (off.get(name), on.get(name)) for name in off.keys() | on.keys()
               if off.get(name) != on.get(name)}
    assert not changed, f"outcomes (without, with the plugin) that differ: {changed}"
    assert sum(v == "passed" for v in on.values()) > 0
