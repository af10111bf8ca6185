"""Tests of the matrix runner: platform files, hardware probes, the workflow, the summary."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from ci.lanes import PLATFORMS_DIR, REPO_ROOT, LaneError, load_lane, load_lanes, probe_hardware
from ci.matrix import (
    _install_step,
    github_matrix,
    make_room,
    parse_pytest_summary,
    remove_packages,
    run_lane,
)

EXPECTED_LANES = {"cpu", "paddle", "xla-cpu", "jax-cpu", "vllm-cpu", "vllm033-cpu", "sglang-cpu",
                  "redis-cpu", "lmdeploy-cpu", "lint", "cuda", "tpu", "xpu", "npu"}
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "matrix.yml"

_MINIMAL = """
name = "{name}"
summary = "a test lane"
needs_hardware = {needs}
[install]
steps = [["numpy"]]
[tests]
markers = "demo"
[github]
runs_on = ["ubuntu-latest"]
{extra}
"""


def _write_lane(tmp_path: Path, name: str = "demo", needs: str = "false", extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(_MINIMAL.format(name=name, needs=needs, extra=extra), encoding="utf-8")
    return path


def test_every_platform_is_declared() -> None:
    lanes = load_lanes()
    assert set(lanes) == EXPECTED_LANES
    for lane in lanes.values():
        assert lane.test_paths and lane.markers and lane.runs_on
        assert lane.venv == REPO_ROOT / f".venv-{lane.name}"


def test_lanes_without_hardware_are_exactly_the_hosted_ones() -> None:
    lanes = load_lanes()
    runnable_anywhere = {name for name, lane in lanes.items() if not lane.needs_hardware}
    assert runnable_anywhere == {"cpu", "paddle", "xla-cpu", "jax-cpu", "vllm-cpu", "vllm033-cpu",
                                 "sglang-cpu", "redis-cpu", "lmdeploy-cpu", "lint"}
    assert {name for name, lane in lanes.items() if lane.self_hosted} == EXPECTED_LANES - runnable_anywhere


def test_xla_lane_pins_torch_to_what_torch_xla_needs() -> None:
    lane = load_lanes()["xla-cpu"]
    assert "torch==2.9.0" in lane.constraints and "torch_xla==2.9.0" in lane.constraints
    assert lane.env["PJRT_DEVICE"] == "CPU"
    # torch must be installed before torch_xla so pip resolves torch_xla against it.
    flat = [req for step in lane.steps for req in step]
    assert flat.index("torch==2.9.0") < flat.index("torch_xla==2.9.0")


def test_workflow_matrix_matches_platform_files() -> None:
    """The workflow takes its lanes from the lane files (a new lane needs no workflow edit):
    the plan job prints ``--github-matrix``, which lists every lane once, on its runners."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    plan_steps = " ".join(step.get("run", "") for step in workflow["jobs"]["plan"]["steps"])
    assert "ci/matrix.py --github-matrix" in plan_steps
    for job_name in ("hosted", "accelerators"):
        include = workflow["jobs"][job_name]["strategy"]["matrix"]["include"]
        assert include == f"${{{{ fromJSON(needs.plan.outputs.{job_name}) }}}}", job_name
    lanes = load_lanes()
    matrices = github_matrix(list(lanes.values()))
    seen = {}
    for job_name, entries in matrices.items():
        for entry in entries:
            assert entry["lane"] not in seen, f"lane {entry['lane']} appears twice"
            seen[entry["lane"]] = (job_name, tuple(entry["runs-on"]), entry["free-disk"])
    assert set(seen) == set(lanes)
    for name, (job_name, runs_on, free_disk) in seen.items():
        assert runs_on == lanes[name].runs_on, name
        assert (job_name == "accelerators") == lanes[name].self_hosted, name
        assert free_disk == lanes[name].free_disk, name
    assert seen["xla-cpu"][2] is True  # its CUDA-built torch wheels need the space


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[tests2]\nx = 1", "unknown key"),
        ("[probe]\nhnt = 'typo'", "unknown key"),
        ("[env]\nN = 1", "values must be strings"),
    ],
)
def test_schema_errors_name_the_problem(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(LaneError, match=message):
        load_lane(_write_lane(tmp_path, extra=extra))


def test_name_must_match_file(tmp_path: Path) -> None:
    path = _write_lane(tmp_path)
    path.rename(tmp_path / "other.toml")
    with pytest.raises(LaneError, match="'demo' must equal the file name 'other'"):
        load_lane(tmp_path / "other.toml")


def test_hardware_lane_needs_a_probe(tmp_path: Path) -> None:
    with pytest.raises(LaneError, match="has no any_path/any_command"):
        load_lane(_write_lane(tmp_path, needs="true"))


def test_probe_by_path_and_command(tmp_path: Path) -> None:
    device = tmp_path / "accel0"
    glob = str(tmp_path / "accel*")
    absent = load_lane(_write_lane(tmp_path, needs="true",
                                   extra=f"[probe]\nany_path = ['{glob}']\nhint = 'no accel here'"))
    assert probe_hardware(absent) == (False, "no accel here")
    device.touch()
    assert probe_hardware(absent) == (True, f"found {device}")
    by_command = load_lane(_write_lane(tmp_path, needs="true",
                                       extra="[probe]\nany_command = [['false'], ['true']]"))
    assert probe_hardware(by_command) == (True, "`true` succeeded")
    failing = load_lane(_write_lane(tmp_path, needs="true",
                                    extra="[probe]\nany_command = [['false'], ['no-such-tool-xyz']]"))
    assert probe_hardware(failing)[0] is False


def test_missing_hardware_skips_or_fails_on_request(tmp_path: Path) -> None:
    lane = load_lane(_write_lane(tmp_path, needs="true", extra=(
        f"[probe]\nany_path = ['{tmp_path}/nothing*']\nhint = 'no demo device'")))
    skipped = run_lane(lane)
    assert (skipped.status, skipped.reason) == ("skipped", "no demo device")
    assert run_lane(lane, require_hardware=True).status == "failed"


def test_parse_pytest_summary() -> None:
    lines = ["collected 9 items", "", "=== 5 passed, 2 skipped, 1 deselected, 1 error in 3.2s ==="]
    assert parse_pytest_summary(lines) == {"passed": 5, "skipped": 2, "deselected": 1, "error": 1}
    assert parse_pytest_summary(["==== 3 failed, 1 passed in 0.1s ===="]) == {"failed": 3, "passed": 1}
    assert parse_pytest_summary(["nothing here"]) == {}


def test_cli_lists_lanes_and_rejects_unknown_ones() -> None:
    script = str(REPO_ROOT / "ci" / "matrix.py")
    listed = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True,
                            check=True, cwd=REPO_ROOT)
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}
    assert set(rows) == EXPECTED_LANES
    assert all(rows[name] == "runs" for name in ("cpu", "paddle", "xla-cpu", "vllm-cpu", "vllm033-cpu", "sglang-cpu",
                                              "lmdeploy-cpu", "lint"))
    bad = subprocess.run([sys.executable, script, "--lane", "gpu9000"], capture_output=True,
                         text=True, check=False, cwd=REPO_ROOT)
    assert bad.returncode == 2
    assert "gpu9000" in bad.stderr and "xla-cpu" in bad.stderr


def test_platform_readme_documents_every_key() -> None:
    readme = (PLATFORMS_DIR / "README.md").read_text(encoding="utf-8")
    for key in ("needs_hardware", "constraints", "steps", "extras", "paths", "markers",
                "keywords", "timeout_minutes", "any_path", "any_command", "hint", "runs_on"):
        assert f"`{key}`" in readme or f"] {key}`" in readme, key


def test_short_disk_removes_finished_venvs_then_skips_with_the_numbers(tmp_path: Path) -> None:
    needy = replace(load_lane(_write_lane(tmp_path, name="needy")), disk_gb=1e6)
    finished = replace(needy, name="pgtest-finished")  # its venv: <repo>/.venv-pgtest-finished
    kept = replace(needy, name="pgtest-kept")
    finished.venv.mkdir(exist_ok=True)
    kept.venv.mkdir(exist_ok=True)
    try:
        assert make_room(replace(needy, disk_gb=0.0), [kept]) is None and kept.venv.exists()
        reason = make_room(needy, [finished])
        assert not finished.venv.exists()
    finally:
        shutil.rmtree(finished.venv, ignore_errors=True)
        shutil.rmtree(kept.venv, ignore_errors=True)
    assert reason is not None
    assert re.fullmatch(r"only \d+\.\d GiB free on disk; a fresh install of this lane needs 1e\+06 GiB",
                        reason), reason
    result = run_lane(needy)
    assert result.status == "skipped" and result.reason.endswith("needs 1e+06 GiB")


def _tiny_wheel(folder: Path, name: str, requires: str = "") -> None:
    """A minimal pure-Python wheel, so pip can resolve and install it with no index."""
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                            + (f"Requires-Dist: {requires}\n" if requires else ""),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def test_one_wheel_at_a_time_installs_each_resolved_wheel_by_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_wheel(wheels, "pgdemo_top", requires="pgdemo_dep")
    _tiny_wheel(wheels, "pgdemo_dep")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels)]
    lane = replace(load_lane(_write_lane(tmp_path)), one_wheel_at_a_time=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    assert _install_step(lane, pip, ("pgdemo_top",), env) is None
    commands = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert "--dry-run" in commands[0]
    assert sorted(c.split()[-1] for c in commands[1:3]) == ["pgdemo_dep==1.0", "pgdemo_top==1.0"]
    assert all("--no-deps" in c for c in commands[1:3]) and commands[3].endswith("pgdemo_top")
    subprocess.run([python, "-c", "import pgdemo_top, pgdemo_dep"], check=True)
    assert _install_step(lane, pip, ("pgdemo_missing",), env) == "could not resolve (pip exited 1)"


def test_uninstall_removes_the_named_packages_after_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _tiny_wheel(wheels, "pgdemo_keep", requires="pgdemo_drop")
    _tiny_wheel(wheels, "pgdemo_drop")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    str(wheels), "pgdemo_keep"], check=True)
    lane = replace(load_lane(_write_lane(tmp_path)), uninstall=("pgdemo_drop",))
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    assert remove_packages(lane, python, env) is None
    probe = "import importlib.util as u; print(bool(u.find_spec('pgdemo_keep')), bool(u.find_spec('pgdemo_drop')))"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
    assert remove_packages(replace(lane, uninstall=()), python, env) is None  # nothing to do


def test_vllm_lane_removes_cuda_linked_extras() -> None:
    lane = load_lanes()["vllm-cpu"]
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(lane.uninstall)
    assert lane.markers == "vllm" and lane.test_paths == ("tests/vllm_plugin",)


def test_lane_that_collects_no_test_fails_with_its_selection(tmp_path: Path) -> None:
    lane = replace(load_lane(_write_lane(tmp_path, name="pgtest-empty")),
                   markers="no_such_marker", test_paths=("tests/test_imports.py",))
    python = lane.venv / "bin" / "python"  # a stand-in venv: this interpreter
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    try:
        result = run_lane(lane, install=False)
    finally:
        shutil.rmtree(lane.venv, ignore_errors=True)
    assert result.status == "failed"
    assert result.reason.startswith(
        "no test was collected: -m 'no_such_marker' in tests/test_imports.py selects nothing")


def test_lane_summary_names_the_failed_and_errored_tests(tmp_path: Path) -> None:
    tests = tmp_path / "test_demo.py"
    tests.write_text(
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def broken_teardown():\n"
        "    yield\n"
        "    raise RuntimeError('teardown broke')\n\n"
        "def test_passes_then_errors(broken_teardown):\n"
        "    pass\n\n"
        "def test_fails():\n"
        "    assert 1 == 2\n")
    lane = replace(load_lane(_write_lane(tmp_path, name="pgtest-problems")), markers="",
                   test_paths=(str(tests),))
    python = lane.venv / "bin" / "python"  # a stand-in venv: this interpreter
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    try:
        result = run_lane(lane, install=False, pytest_args=["-ra"])
    finally:
        shutil.rmtree(lane.venv, ignore_errors=True)
    assert result.status == "failed"
    assert result.counts == {"failed": 1, "passed": 1, "error": 1}
    assert [(line.split()[0], line.split(" - ")[0].split("::")[-1]) for line in result.problems] == [
        ("ERROR", "test_passes_then_errors"), ("FAILED", "test_fails")]
    assert result.problems[0].endswith("RuntimeError: teardown broke")
