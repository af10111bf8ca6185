"""Where the MaskBench data is: ``$PORTABLE_GUIDED_MASKBENCH``, beside the checkout
(``../shared/data/maskbench``) or at ``/work/shared/data/maskbench``; None if nowhere."""

from __future__ import annotations

import os
from pathlib import Path


def maskbench_dir() -> Path | None:
    """The MaskBench folder (holding ``Github_easy.jsonl``), or None."""
    here = Path(__file__).resolve().parents[2]
    for cand in (os.environ.get("PORTABLE_GUIDED_MASKBENCH"), here.parent / "shared/data/maskbench",
                 Path("/work/shared/data/maskbench")):
        if cand and Path(cand, "Github_easy.jsonl").exists():
            return Path(cand)
    return None
