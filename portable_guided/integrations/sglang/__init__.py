"""portable_guided inside SGLang: an ``sglang.srt.plugins`` entry point.

SGLang's ``load_plugins()`` calls :func:`register` in each of its processes, then applies the
registered hooks. :func:`register` adds REPLACE hooks (``HookRegistry``) so that the grammar
objects' ``apply_vocab_mask`` goes through :func:`portable_guided.apply_token_mask` on the
logits' own device (:mod:`.apply`):

- ``XGrammarGrammar.apply_vocab_mask`` (xgrammar's CPU kernel or SGLang's Triton kernel
  upstream);
- ``XGrammarGrammarBackend.apply_vocab_mask``, the static one SGLang's reasoner wrapper uses
  for rows without a grammar (upstream: ``Unsupported device: cpu`` on the CPU);
- ``GuidanceGrammar.apply_vocab_mask`` (llguidance's Torch kernel upstream);
- ``OutlinesGrammar.apply_vocab_mask`` (one ``masked_fill_`` of a bool mask upstream; packed
  into words on the CPU, SGLang's own on accelerators: see :mod:`.apply`).

Reasoner wrappers hand out one of these, so they are covered too. Each hook is registered only when
the source of every SGLang function it relies on matches a verified SGLang build, and its
first calls of each kind are compared with SGLang's own function (:mod:`.guard`).

It also registers the grammar backend ``portable_guided`` (``--grammar-backend
portable_guided``): our :class:`~portable_guided.runtime.GrammarRuntime` behind SGLang's
``BaseGrammarObject`` contract (:mod:`.backend`).

Environment:

- ``PORTABLE_GUIDED_SGLANG=0`` turns the plugin off; ``force`` registers hooks whose SGLang
  functions match no verified build (a loud warning; the canary still checks the first
  calls). Default ``1``: verified builds only.
- The backend's settings: ``PORTABLE_GUIDED_SGLANG_ENGINE`` (``xgrammar``, ``llguidance`` or
  ``auto``; default ``auto``, the fastest compile; the language is xgrammar's strict mode
  on every engine, and ``xgrammar`` keeps masks identical to SGLang's own xgrammar
  backend), ``PORTABLE_GUIDED_SGLANG_COMPILE_TIMEOUT_S`` (default 30),
  ``PORTABLE_GUIDED_SGLANG_CACHE_DIR`` (on-disk compile cache shared by processes), and the
  runtime's own cache settings (docs/cache.md): ``PORTABLE_GUIDED_CACHE_URL`` (a Redis shared
  by every rank and host: one compile per schema for the fleet, failures shared),
  ``PORTABLE_GUIDED_CACHE_SECRET`` (authenticates entries; the fleet shares it),
  ``PORTABLE_GUIDED_CACHE_SHARED=1`` (a cache directory shared on purpose).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from typing import Any

__all__ = ["BACKEND_NAME", "ENV_ENABLE", "TESTED_SGLANG_VERSIONS", "is_patched", "register",
           "taken_over", "unpatch"]

#: Environment variable that turns the plugin off (``0``) or forces it (``force``).
ENV_ENABLE = "PORTABLE_GUIDED_SGLANG"
#: SGLang versions whose functions this plugin was verified against.
TESTED_SGLANG_VERSIONS = ("0.5.23",)
#: The grammar backend name (``--grammar-backend portable_guided``).
BACKEND_NAME = "portable_guided"

#: Hook -> (dotted target for ``HookRegistry``, the library its SGLang module needs).
_TARGETS: dict[str, tuple[str, str]] = {
    "xgrammar": ("sglang.srt.constrained.xgrammar_backend.XGrammarGrammar.apply_vocab_mask",
                 "xgrammar"),
    "xgrammar_static": (
        "sglang.srt.constrained.xgrammar_backend.XGrammarGrammarBackend.apply_vocab_mask",
        "xgrammar"),
    "llguidance": ("sglang.srt.constrained.llguidance_backend.GuidanceGrammar.apply_vocab_mask",
                   "llguidance"),
    "outlines": ("sglang.srt.constrained.outlines_backend.OutlinesGrammar.apply_vocab_mask",
                 "outlines"),
}

logger = logging.getLogger("sglang.plugins.portable_guided")
_lock = threading.Lock()


def register() -> None:
    """The entry point SGLang's ``load_plugins()`` calls; safe to call more than once."""
    setting = os.environ.get(ENV_ENABLE, "1").strip().lower()
    if setting in ("0", "false", "off", "no"):
        logger.info("portable_guided SGLang plugin disabled by %s=%s", ENV_ENABLE, setting)
        return
    import sglang

    version = str(getattr(sglang, "__version__", "unknown"))
    with _lock:
        from . import apply

        if not apply.TAKEOVERS:
            _register_hooks(version, force=setting == "force")
        from .backend import register_backend

        register_backend()


def is_patched() -> bool:
    """Whether any SGLang ``apply_vocab_mask`` is ours in this process (hooks applied)."""
    from . import apply

    return any(_installed(hook) for hook in apply.TAKEOVERS)


def taken_over() -> dict[str, str]:
    """Hook -> ``verified`` or ``forced``, for the hooks registered by this process."""
    from . import apply

    return {hook: "forced" if t.forced else "verified" for hook, t in apply.TAKEOVERS.items()}


def unpatch() -> None:
    """Put SGLang's own functions back and drop our hooks (tests compare on and off)."""
    with _lock:
        from . import apply

        for hook in list(apply.TAKEOVERS):
            _restore(hook)


def _owner(target: str) -> tuple[Any, str]:
    import pkgutil

    owner_path, attr = target.rsplit(".", 1)
    return pkgutil.resolve_name(owner_path), attr


def _installed(hook: str) -> bool:
    from . import apply

    owner, attr = _owner(_TARGETS[hook][0])
    return _installed_function(owner, attr, apply.TAKEOVERS[hook].original)


def _restore(hook: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    from . import apply

    takeover = apply.TAKEOVERS.pop(hook, None)
    if takeover is None:
        return
    owner, attr = _owner(takeover.target)
    if _installed_function(owner, attr, takeover.original):
        setattr(owner, attr, staticmethod(takeover.original) if takeover.static
                else takeover.original)
    mine = apply.HOOKS[hook][0]
    hooks = HookRegistry._hooks.get(takeover.target, [])
    hooks[:] = [entry for entry in hooks if entry[1] is not mine]
    if not hooks:
        HookRegistry._hooks.pop(takeover.target, None)
        HookRegistry._patched.discard(takeover.target)


def _installed_function(owner: Any, attr: str, original: Any) -> bool:
    raw = owner.__dict__.get(attr)
    function = getattr(raw, "__func__", raw)
    return getattr(function, "__wrapped__", None) is original


def _register_hooks(version: str, *, force: bool) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import apply, guard

    found = guard.current(version)
    taken: list[str] = []
    refused: list[str] = []
    for hook, (target, library) in _TARGETS.items():
        if importlib.util.find_spec(library) is None:
            continue  # that backend cannot run in this process: nothing to cover
        owner, attr = _owner(target)
        raw = owner.__dict__.get(attr)
        replacement, static = apply.HOOKS[hook]
        if isinstance(raw, staticmethod) != static or raw is None:
            refused.append(f"{target}: not a{' static' if static else 'n instance'} method")
            continue
        build = guard.GUARD.match(found, hook)
        verified = build is not None
        if not verified and not force:
            refused.append(f"{hook}: {guard.mismatches(found, hook)}")
            continue
        if not verified:
            logger.warning(
                "%s=force: portable_guided replaces %s of SGLang %s although %s (verified: "
                "%s). Masks may be WRONG; the first calls of each kind are checked against "
                "SGLang's own function.", ENV_ENABLE, target, version,
                guard.mismatches(found, hook), ", ".join(guard.KNOWN))
        takeover = guard.Takeover(name=hook, target=target, static=static,
                                  original=getattr(raw, "__func__", raw),
                                  build=build if build is not None else guard.FORCED)
        takeover.canary = guard.canary(hook, lambda h=hook: _restore(h))  # type: ignore[misc]
        apply.TAKEOVERS[hook] = takeover
        HookRegistry.register(target, replacement, HookType.REPLACE)
        taken.append(hook)
    if taken:
        logger.info(
            "portable_guided takes over SGLang %s's grammar vocab-mask application (%s; %s; "
            "pid %d)", version, ", ".join(taken),
            "FORCED" if any(apply.TAKEOVERS[h].forced for h in taken) else "verified build",
            os.getpid())
    if refused:
        logger.warning(
            "portable_guided leaves SGLang %s's vocab-mask application unchanged for %s "
            "(verified builds: %s; set %s=force to patch anyway)", version, "; ".join(refused),
            ", ".join(guard.KNOWN), ENV_ENABLE)
    if "sglang.srt.plugins" in sys.modules and not taken:
        logger.info("portable_guided registered no vocab-mask hook in SGLang %s", version)
