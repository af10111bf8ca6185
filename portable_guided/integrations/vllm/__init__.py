"""portable_guided inside vLLM: a ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It replaces vLLM's grammar-bitmask application with
:func:`portable_guided.integrations.vllm.apply.apply_grammar_bitmask` (same semantics,
through :func:`portable_guided.apply_token_mask` on whatever device the logits live) and, when
``PORTABLE_GUIDED_VLLM_BACKEND=1``, serves structured outputs from our
:class:`~portable_guided.runtime.GrammarRuntime` (see :mod:`.backend`).

Environment:

- ``PORTABLE_GUIDED_VLLM=0`` turns the plugin off; ``force`` patches even a vLLM version it
  was not tested with (default ``1``: patch tested versions only, warn otherwise).
- ``PORTABLE_GUIDED_VLLM_BACKEND=1`` also uses the grammar runtime as the backend of requests
  whose backend is ``xgrammar`` or ``guidance`` (default ``0``). Its settings:
  ``PORTABLE_GUIDED_VLLM_ENGINE`` (``xgrammar``, ``llguidance`` or ``auto``; default
  ``xgrammar``), ``PORTABLE_GUIDED_VLLM_COMPILE_TIMEOUT_S`` (default 30),
  ``PORTABLE_GUIDED_VLLM_CACHE_DIR`` (on-disk compile cache shared by processes; default
  none).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
from typing import Any

__all__ = ["ENV_ENABLE", "ENV_BACKEND", "TESTED_VLLM_VERSIONS", "is_patched", "register",
           "unpatch"]

#: Environment variable that turns the plugin off (``0``) or forces it (``force``).
ENV_ENABLE = "PORTABLE_GUIDED_VLLM"
#: Environment variable that also makes the grammar runtime vLLM's structured-output backend.
ENV_BACKEND = "PORTABLE_GUIDED_VLLM_BACKEND"
#: vLLM versions whose ``apply_grammar_bitmask`` and structured-output manager this plugin
#: was tested against (tests/vllm). Other versions are left alone unless forced.
TESTED_VLLM_VERSIONS = ("0.32.0",)

_APPLY_PARAMS = ["scheduler_output", "grammar_output", "input_batch", "logits"]
_APPLY_MODULES = ("vllm.v1.structured_output.utils", "vllm.v1.worker.gpu_model_runner")

logger = logging.getLogger("vllm.plugins.portable_guided")

_lock = threading.Lock()
_original_apply: list[Any] = []  # vLLM's function, while ours is installed


def register() -> None:
    """The entry point vLLM calls in each process; safe to call more than once."""
    setting = os.environ.get(ENV_ENABLE, "1").strip().lower()
    if setting in ("0", "false", "off", "no"):
        logger.info("portable_guided vLLM plugin disabled by %s=%s", ENV_ENABLE, setting)
        return
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    if version not in TESTED_VLLM_VERSIONS and setting != "force":
        logger.warning(
            "portable_guided was tested with vLLM %s, not %s: leaving vLLM's grammar bitmask "
            "path unchanged (set %s=force to patch anyway)",
            ", ".join(TESTED_VLLM_VERSIONS), version, ENV_ENABLE,
        )
        return
    with _lock:
        if not is_patched():
            _patch_apply(version)
        if _flag(ENV_BACKEND):
            from .backend import install_backend

            install_backend()


def is_patched() -> bool:
    """Whether vLLM's grammar bitmask application is ours in this process."""
    return bool(_original_apply)


def unpatch() -> None:
    """Restore vLLM's own functions (tests compare plugin on and off in one engine)."""
    from . import apply

    with _lock:
        for original in _original_apply:
            for module_name in _APPLY_MODULES:
                module: Any = sys.modules.get(module_name)
                if getattr(module, "apply_grammar_bitmask", None) is apply.apply_grammar_bitmask:
                    module.apply_grammar_bitmask = original
        _original_apply.clear()
        from .backend import uninstall_backend

        uninstall_backend()


def _patch_apply(version: str) -> None:
    from vllm.v1.structured_output import utils

    from . import apply

    original = getattr(utils, "apply_grammar_bitmask", None)
    if original is None or list(inspect.signature(original).parameters) != _APPLY_PARAMS:
        # A different function under the same name would be called with our arguments:
        # never risk a wrong mask on a batch.
        logger.warning(
            "vLLM %s's apply_grammar_bitmask does not have the expected signature %s: "
            "portable_guided leaves it unchanged", version, _APPLY_PARAMS,
        )
        return
    _original_apply.append(original)
    for module_name in _APPLY_MODULES:
        # The model runner imports the name at its own import: patch it there if it is
        # loaded already, else it picks ours up from utils when it loads.
        module: Any = sys.modules.get(module_name)
        if module is not None and getattr(module, "apply_grammar_bitmask", None) is original:
            module.apply_grammar_bitmask = apply.apply_grammar_bitmask
    logger.info(
        "portable_guided took over vLLM %s's grammar bitmask application (pid %d)",
        version, os.getpid(),
    )


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "on", "yes")
