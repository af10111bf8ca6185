"""Implementations of ``apply_token_mask``, one module per strategy.

Every kernel has the signature ``kernel(logits, bitmask, plan) -> logits_or_result`` where
``plan`` is the validated :class:`portable_guided.validation.MaskPlan`. Modules import their
framework inside their functions, so importing one pulls in no framework
(``tests/test_imports.py`` checks every kernel a built-in platform names); the registry imports
a module only once its platform is chosen.
"""

from __future__ import annotations

import os
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


# os.environ keeps its items encoded in ``_data`` on POSIX: a membership test there costs a
# dict lookup, where ``os.environ.get`` encodes the name and decodes the value (about 0.5 us
# on an H200 host, three times per plain call).
_POSIX = os.name == "posix"
_ENCODED_NAMES: dict[str, bytes] = {}


def env_may_be_set(name: str) -> bool:
    """Whether the environment variable ``name`` may be set (an empty value counts as set):
    the plain-call fast paths take the general path, which reads the value, when it is."""
    data = getattr(os.environ, "_data", None)
    if not _POSIX or type(data) is not dict:
        return name in os.environ
    key = _ENCODED_NAMES.get(name)
    if key is None:
        key = _ENCODED_NAMES.setdefault(name, os.fsencode(name))
    return key in data
