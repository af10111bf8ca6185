"""Every lane's test selection collects at least one test (collection only: no hardware).

``ci/collect.py`` runs once, with this interpreter, over every lane in ``platforms/``. A lane
whose paths collect no test at all in this venv (``tests/xla`` without torch_xla,
``tests/vllm_plugin`` without vLLM) cannot be judged here and is skipped with the reason; on its
own runner ``ci/matrix.py`` fails it if it collects nothing (pytest's exit status 5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci.collect import problem
from ci.lanes import REPO_ROOT, load_lanes

LANES = load_lanes()


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=900, check=False)


@pytest.fixture(scope="module")
def counts() -> dict:
    done = _collect(str(REPO_ROOT / "ci" / "collect.py"))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", sorted(LANES))
def test_lane_selects_at_least_one_test(name: str, counts: dict) -> None:
    lane, found = LANES[name], counts[name]
    if not found["selected"] and not found["unfiltered"]:
        why = "; ".join(f"{path}: {reason}" for path, reason in found["module_skips"])
        pytest.skip(f"lane {name}: {' '.join(lane.test_paths)} collects no test in this venv "
                    f"({why or 'its conftest ignores them'}); ci/matrix.py checks it on the lane")
    assert problem(lane, found) is None
    assert found["selected"] >= 1


_LANE = """
name = "{name}"
summary = "a test lane"
needs_hardware = false
[install]
steps = []
[tests]
paths = ["tests/test_imports.py"]
markers = "{markers}"
[github]
runs_on = ["ubuntu-latest"]
"""


def test_a_selection_that_matches_nothing_is_a_problem(tmp_path: Path) -> None:
    for name, markers in (("empty", "no_such_marker"), ("fine", "not no_such_marker")):
        (tmp_path / f"{name}.toml").write_text(_LANE.format(name=name, markers=markers))
    script = ("import json, sys\n"
              "from pathlib import Path\n"
              "from ci.collect import collect_lane, problem\n"
              "from ci.lanes import load_lane\n"
              "lanes = [load_lane(Path(p)) for p in sys.argv[1:]]\n"
              "found = [problem(lane, collect_lane(lane)) for lane in lanes]\n"
              "print(json.dumps(found))\n")
    done = _collect("-c", script, str(tmp_path / "empty.toml"), str(tmp_path / "fine.toml"))
    assert done.returncode == 0, done.stderr[-3000:]
    empty, fine = json.loads(done.stdout.splitlines()[-1])
    assert empty.startswith("lane 'empty' selects no test: -m 'no_such_marker' matches none of")
    assert "platforms/empty.toml" in empty
    assert fine is None
