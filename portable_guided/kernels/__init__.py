"""Implementations of ``apply_token_mask``, one module per strategy.

Every kernel has the signature ``kernel(logits, bitmask, plan) -> logits_or_result`` where
``plan`` is the validated :class:`portable_guided.validation.MaskPlan`. Modules import their
framework inside their functions, so importing one pulls in no framework
(``tests/test_imports.py`` checks every kernel a built-in platform names); the registry imports
a module only once its platform is chosen.
"""

from __future__ import annotations

import sys
from typing import Any


def plain_torch_pair(logits: Any, bitmask: Any) -> Any:
    """The ``torch`` module when ``logits`` and ``bitmask`` are both plain ``torch.Tensor``
    (no subclass), else None: the first test of the plain-call fast paths (it imports
    nothing)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    if type(logits) is not tensor or type(bitmask) is not tensor:
        return None
    return torch
