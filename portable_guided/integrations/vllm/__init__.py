"""portable_guided inside vLLM: a ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It replaces the grammar-bitmask application of both model runners with ours (same rows,
through :func:`portable_guided.apply_token_mask` on whatever device the logits live):

- Model Runner V1: ``vllm.v1.structured_output.utils.apply_grammar_bitmask``
  (:mod:`.apply`);
- Model Runner V2 (vLLM's default on CUDA): ``StructuredOutputsWorker.apply_grammar_bitmask``
  (:mod:`.v2`).

Each runner is taken over only when the source of every vLLM function its replacement relies
on matches a verified vLLM build (:mod:`.guard`), and the first calls of each kind are
checked against vLLM's own function (the canary). When ``PORTABLE_GUIDED_VLLM_BACKEND=1``,
it also serves structured outputs from our :class:`~portable_guided.runtime.GrammarRuntime`
(see :mod:`.backend`).

Environment:

- ``PORTABLE_GUIDED_VLLM=0`` turns the plugin off; ``force`` patches a runner whose vLLM
  functions match no verified build (layout guessed from the version number, a loud
  warning; the canary still checks the first calls). Default ``1``: verified builds only.
- ``PORTABLE_GUIDED_VLLM_BACKEND=1`` also uses the grammar runtime as the backend of requests
  whose backend is ``xgrammar`` or ``guidance`` (default ``0``). Its settings:
  ``PORTABLE_GUIDED_VLLM_ENGINE`` (``xgrammar``, ``llguidance`` or ``auto``; default
  ``auto``, the fastest first token on new schemas; the language is vLLM's, xgrammar's
  strict mode, on every engine, and ``xgrammar`` keeps greedy outputs token-identical to
  vLLM's own backend), ``PORTABLE_GUIDED_VLLM_COMPILE_TIMEOUT_S`` (default 30),
  ``PORTABLE_GUIDED_VLLM_COMPILE_WORKERS`` (compile worker processes; default half the
  cores, as vLLM's own grammar threads, at most 4), ``PORTABLE_GUIDED_VLLM_COMPILE_RACE``
  (``1``: race each worker compile in this process, see ``GrammarRuntime``),
  ``PORTABLE_GUIDED_VLLM_CACHE_DIR`` (on-disk compile cache shared by processes; default
  none), and the runtime's own cache settings (docs/cache.md): ``PORTABLE_GUIDED_CACHE_URL``
  (a Redis shared by every engine core and host: one compile per schema for the fleet,
  failures shared), ``PORTABLE_GUIDED_CACHE_SECRET`` (authenticates entries; the fleet
  shares it), ``PORTABLE_GUIDED_CACHE_SHARED=1`` (a cache directory shared on purpose).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
from typing import Any

__all__ = ["ENV_ENABLE", "ENV_BACKEND", "TESTED_VLLM_VERSIONS", "is_patched", "register",
           "taken_over", "unpatch"]

#: Environment variable that turns the plugin off (``0``) or forces it (``force``).
ENV_ENABLE = "PORTABLE_GUIDED_VLLM"
#: Environment variable that also makes the grammar runtime vLLM's structured-output backend.
ENV_BACKEND = "PORTABLE_GUIDED_VLLM_BACKEND"
#: vLLM versions whose functions this plugin was verified against (fingerprints in
#: :data:`.guard.KNOWN`). Other builds are left alone unless forced.
TESTED_VLLM_VERSIONS = ("0.32.0", "0.33.0")

_V1_PARAMS = ["scheduler_output", "grammar_output", "input_batch", "logits"]
_V1_MODULES = ("vllm.v1.structured_output.utils", "vllm.v1.worker.gpu_model_runner")
_V2_MODULE = "vllm.v1.worker.gpu.structured_outputs"
_V2_PARAMS = ["self", "logits", "input_batch", "grammar_req_ids", "grammar_bitmask"]
_RUNNER_NAMES = {"v1": "Model Runner V1", "v2": "Model Runner V2"}

logger = logging.getLogger("vllm.plugins.portable_guided")

_lock = threading.Lock()
_takeovers: dict[str, Any] = {}  # runner -> guard.Takeover, while ours is installed
_v2_init: list[Any] = []  # vLLM's StructuredOutputsWorker.__init__, while wrapped


def register() -> None:
    """The entry point vLLM calls in each process; safe to call more than once."""
    setting = os.environ.get(ENV_ENABLE, "1").strip().lower()
    if setting in ("0", "false", "off", "no"):
        logger.info("portable_guided vLLM plugin disabled by %s=%s", ENV_ENABLE, setting)
        return
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    with _lock:
        if not _takeovers and not _v2_init:
            _take_over(version, force=setting == "force")
        if _flag(ENV_BACKEND):
            from .backend import install_backend

            install_backend()


def is_patched() -> bool:
    """Whether any runner's grammar bitmask application is ours in this process."""
    return bool(_takeovers)


def taken_over() -> dict[str, str]:
    """Runner (``v1``, ``v2``) -> the verified build whose layout it serves (or ``forced``)."""
    return {runner: t.build for runner, t in _takeovers.items()}


def unpatch() -> None:
    """Restore vLLM's own functions (tests compare plugin on and off in one engine)."""
    with _lock:
        for runner in list(_takeovers):
            _restore(runner)
        if _v2_init:
            sys.modules[_V2_MODULE].StructuredOutputsWorker.__init__ = _v2_init.pop()
        from .backend import uninstall_backend

        uninstall_backend()


def _restore(runner: str) -> None:
    from . import apply, v2

    takeover = _takeovers.pop(runner, None)
    if takeover is None:
        return
    if runner == "v1":
        for module_name in _V1_MODULES:
            module: Any = sys.modules.get(module_name)
            if getattr(module, "apply_grammar_bitmask", None) is apply.apply_grammar_bitmask:
                module.apply_grammar_bitmask = takeover.original
        apply.TAKEOVER = None
    else:
        cls = sys.modules[_V2_MODULE].StructuredOutputsWorker
        if cls.__dict__.get("apply_grammar_bitmask") is v2.apply_grammar_bitmask:
            cls.apply_grammar_bitmask = takeover.original
        v2.TAKEOVER = None


def _take_over(version: str, *, force: bool) -> None:
    from . import guard

    found = guard.current(version)
    refused: list[str] = []
    for runner in ("v1", "v2"):
        original, why = _vllm_function(runner)
        if original is None:
            if why:
                refused.append(f"{_RUNNER_NAMES[runner]}: {why}")
            continue
        matched = guard.match(found, runner)
        if matched is None and not force:
            refused.append(f"{_RUNNER_NAMES[runner]}: {guard.mismatches(found, runner)}")
            continue
        if matched is None:
            build, layout = guard.FORCED, guard.layout_for_version(version)
            logger.warning(
                "PORTABLE_GUIDED_VLLM=force: portable_guided takes over %s of vLLM %s although "
                "%s (verified: %s); assuming the %s bitmask layout. Masks may be WRONG; the "
                "first calls of each kind are checked against vLLM's own function.",
                _RUNNER_NAMES[runner], version, guard.mismatches(found, runner),
                ", ".join(guard.KNOWN), layout,
            )
        else:
            build, layout = matched
        _install(runner, original,
                 guard.Takeover(name=runner, build=build, layout=layout, original=original))
        logger.info(
            "portable_guided took over vLLM %s's grammar bitmask application in %s "
            "(%s, %s layout; pid %d)", version, _RUNNER_NAMES[runner],
            "FORCED" if build == "forced" else f"verified build {build}", layout, os.getpid(),
        )
    if refused:
        logger.warning(
            "portable_guided leaves vLLM %s's grammar bitmask application unchanged for %s "
            "(verified builds: %s; set %s=force to patch anyway)",
            version, "; ".join(refused), ", ".join(guard.KNOWN) or "none", ENV_ENABLE,
        )
    if "v2" not in _takeovers and _V2_MODULE in sys.modules:
        _watch_v2()


def _vllm_function(runner: str) -> tuple[Any, str]:
    """vLLM's function for ``runner`` with the expected signature, or ``(None, why)``."""
    import importlib

    if runner == "v1":
        module: Any = importlib.import_module(_V1_MODULES[0])
        original = getattr(module, "apply_grammar_bitmask", None)
        expected = _V1_PARAMS
    else:
        try:
            module = importlib.import_module(_V2_MODULE)
        except ImportError:  # a vLLM without V2, or V2 deps missing: nothing to cover
            return None, ""
        original = getattr(getattr(module, "StructuredOutputsWorker", None),
                           "apply_grammar_bitmask", None)
        expected = _V2_PARAMS
    if original is None or list(inspect.signature(original).parameters) != expected:
        # A different function under the same name would be called with our arguments:
        # never risk a wrong mask on a batch.
        return None, f"apply_grammar_bitmask does not have the expected signature {expected}"
    return original, ""


def _install(runner: str, original: Any, takeover: Any) -> None:
    from . import apply, guard, v2

    takeover.canary = guard.canary(runner, lambda: _restore_from_canary(runner))
    _takeovers[runner] = takeover
    if runner == "v1":
        apply.TAKEOVER = takeover
        for module_name in _V1_MODULES:
            # The model runner imports the name at its own import: patch it there if it is
            # loaded already, else it picks ours up from utils when it loads.
            module: Any = sys.modules.get(module_name)
            if module is not None and getattr(module, "apply_grammar_bitmask", None) is original:
                module.apply_grammar_bitmask = apply.apply_grammar_bitmask
    else:
        v2.TAKEOVER = takeover
        sys.modules[_V2_MODULE].StructuredOutputsWorker.apply_grammar_bitmask = (
            v2.apply_grammar_bitmask)


def _restore_from_canary(runner: str) -> None:
    # Called from inside our apply (the canary holds its own lock, not ours).
    _restore(runner)


def _watch_v2() -> None:
    """A V2 runner that we do not cover says so when it starts (vLLM's code runs unchanged)."""
    cls = sys.modules[_V2_MODULE].StructuredOutputsWorker
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if "v2" not in _takeovers:
            logger.warning(
                "vLLM's Model Runner V2 is active and portable_guided does not cover it in this "
                "process: vLLM applies the grammar masks itself (pid %d)", os.getpid())

    _v2_init.append(original_init)
    cls.__init__ = __init__


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "on", "yes")
