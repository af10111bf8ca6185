"""Print the Markdown table of a ``portable-guided bench maskbench --json`` result.

    python bench/maskbench_table.py bench/results/maskbench_dev_full.json
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from portable_guided.harness.maskbench import summary_table


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        result = json.load(f)
    print(summary_table(result.get("modes") or {result["mode"]: result["summary"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
