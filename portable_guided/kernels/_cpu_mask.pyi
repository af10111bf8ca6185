"""Types of the compiled CPU kernel (``_cpu_mask.c``); see ``kernels/compiled.py``."""

from typing import Any

def mask_rows(
    bits: Any, bitmask: Any, rows: Any, bitmask_rows: Any, vocab: int, neg: int,
    threads: int = 0, /,
) -> None: ...
def openmp_runtime() -> str | None: ...
