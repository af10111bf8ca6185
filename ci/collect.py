"""How many tests each lane's selection collects, with this interpreter (collection only).

A lane whose ``-m``/``-k`` selection matches nothing would fail on its runner with "no test was
collected" (``ci/matrix.py``), which for an accelerator lane is found only on the hardware.
Collecting needs no hardware, so this runs anywhere: ``ci/tests/test_lane_selection.py`` checks
every lane with it. A test module that skips itself at import because a package is missing here
(``pytest.importorskip("torch_xla")`` outside the xla lanes) collects nothing; such modules are
reported with their reason; and when a selection collects nothing, the lane's paths are
collected again without it, so :func:`problem` can tell "selects nothing" (a wrong ``-m``/``-k``:
an error) from "nothing here to select from" (the lane's packages are missing in this venv:
checked on the lane itself, where ``ci/matrix.py`` fails a lane that collects no test).

Usage::

    python ci/collect.py            # every lane
    python ci/collect.py cuda xpu   # some lanes

Prints one JSON object: lane -> {"selected": N, "unfiltered": M or null, "module_skips":
[[path, reason], ...], "exit": pytest's exit code}; exit status 1 if a lane selects nothing.
Needs pytest (a lane venv, or the project's dev venv).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``ci`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.lanes import REPO_ROOT, Lane, load_lanes

__all__ = ["collect_lane", "main", "problem"]


class _Recorder:
    """A pytest plugin that keeps the selected items and the modules skipped at import."""

    def __init__(self) -> None:
        self.selected = 0
        self.module_skips: list[list[str]] = []

    def pytest_collectreport(self, report: Any) -> None:
        if report.skipped and isinstance(report.longrepr, tuple):
            path, _, reason = report.longrepr
            self.module_skips.append([str(Path(path).relative_to(REPO_ROOT)
                                          if Path(path).is_absolute() else path), reason])

    def pytest_collection_finish(self, session: Any) -> None:
        self.selected = len(session.items)


def _collect(paths: Sequence[str], selection: Sequence[str]) -> tuple[_Recorder, int]:
    import pytest

    recorder = _Recorder()
    # One process for every lane: test modules are imported once, later collections reuse them.
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO_ROOT),
            *selection, *(str(REPO_ROOT / path) for path in paths)]
    return recorder, int(pytest.main(args, plugins=[recorder]))


def collect_lane(lane: Lane) -> dict[str, Any]:
    """Collect ``lane``'s selection in this process; returns its counts (see the module)."""
    selection = [*(["-m", lane.markers] if lane.markers else []),
                 *(["-k", lane.keywords] if lane.keywords else [])]
    recorder, code = _collect(lane.test_paths, selection)
    unfiltered = None
    if recorder.selected == 0:
        unfiltered = _collect(lane.test_paths, [])[0].selected
    return {"selected": recorder.selected, "unfiltered": unfiltered,
            "module_skips": recorder.module_skips, "exit": code}


def problem(lane: Lane, counts: dict[str, Any]) -> str | None:
    """Why ``lane``'s selection is wrong, judged from :func:`collect_lane`'s counts, or None.

    A selection that collects nothing is wrong when the lane's paths do collect tests here;
    when they collect none either (their packages are missing in this venv), nothing can be
    judged here and None is returned.
    """
    if counts["selected"] or not counts["unfiltered"]:
        return None
    selection = f"-m {lane.markers!r}" + (f" -k {lane.keywords!r}" if lane.keywords else "")
    return (f"lane {lane.name!r} selects no test: {selection} matches none of the "
            f"{counts['unfiltered']} tests in {' '.join(lane.test_paths)} "
            f"(fix [tests] in platforms/{lane.name}.toml or mark the tests)")


def main(argv: Sequence[str] | None = None) -> int:
    """Collect the named lanes (default: all) and print the JSON report on stdout."""
    names = list(sys.argv[1:] if argv is None else argv)
    lanes = load_lanes()
    unknown = [name for name in names if name not in lanes]
    if unknown:
        print(f"error: unknown lane(s) {unknown}; available: {sorted(lanes)}", file=sys.stderr)
        return 2
    report = {}
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # pytest's own listing goes to stderr; stdout is the JSON alone
    try:
        for name in names or lanes:
            report[name] = collect_lane(lanes[name])
    finally:
        sys.stdout = real_stdout
    print(json.dumps(report, indent=1))
    problems = [p for p in (problem(lanes[n], c) for n, c in report.items()) if p]
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
