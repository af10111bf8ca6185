"""The framework-neutral guided decode loop.

* :mod:`.overlap`: :class:`OverlappedStep`, run CPU grammar work while the device runs a step.
* :mod:`.device`: the :class:`Runner` protocol a model runner implements.
* :mod:`.engine`: :class:`Generator`, batched guided generation with continuous joining,
  overlap and speculative verification.
* :mod:`.draft`: prompt-lookup (n-gram) draft tokens, as a chain or a :class:`DraftTree`.
* :mod:`.simulated`: a simulated device whose forward sleeps, for clean overlap measurements.

Importing this package imports no framework.
"""

from __future__ import annotations

from portable_guided.decode.device import Pending, Ready, Runner, SamplingParams, tree_layout
from portable_guided.decode.draft import DraftTree, NgramDraft
from portable_guided.decode.overlap import OverlappedStep

__all__ = [
    "DraftTree",
    "NgramDraft",
    "OverlappedStep",
    "Pending",
    "Ready",
    "Runner",
    "SamplingParams",
    "tree_layout",
]
