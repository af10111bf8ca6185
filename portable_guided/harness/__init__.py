"""Benchmark and conformance harnesses that drive the grammar runtime from outside.

- :mod:`portable_guided.harness.maskbench`: MaskBench (compile each JSON schema, walk its test
  instances token by token; ``portable-guided bench maskbench``).
- :mod:`portable_guided.harness.differential`: the cross-engine differential (do xgrammar and
  llguidance accept the same instances of a schema?).

They sit outside :mod:`portable_guided.runtime` because they are clients of it, not part of
it. Nothing is imported here: each harness loads NumPy and the runtime only when imported.
"""

from __future__ import annotations

__all__: list[str] = []
