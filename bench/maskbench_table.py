"""Print the Markdown table of a ``portable-guided bench maskbench --json`` result.

    python bench/maskbench_table.py bench/results/maskbench_dev_full.json
"""

from __future__ import annotations

import json
import sys

COLUMNS = ("compiled", "compile_errors", "timeouts", "passing", "valid_ok", "invalid_ok")


def table(result: dict) -> str:
    """One row per mode: coverage counts, compile and mask time percentiles."""
    modes = result.get("modes") or {result.get("mode", "run"): result["summary"]}
    lines = [
        "| mode | schemas | compiled | compile err | timeouts | passing | valid ok | invalid ok "
        "| compile ms p50 / p90 / p99 | mask us p50 / p99 / mean | tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for mode, s in modes.items():
        counts = " | ".join(str(s[c]) for c in COLUMNS)
        lines.append(
            f"| {mode.replace(':', ' ')} | {s['schemas']} | {counts} "
            f"| {s['compile_ms_p50']:.1f} / {s['compile_ms_p90']:.1f} / {s['compile_ms_p99']:.0f} "
            f"| {s['mask_us_p50']:.1f} / {s['mask_us_p99']:.0f} / {s['mask_us_mean']:.1f} "
            f"| {s['tokens']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        print(table(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
