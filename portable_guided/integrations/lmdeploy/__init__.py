"""portable_guided inside lmdeploy's PyTorch engine.

lmdeploy has no plugin mechanism and starts its engine (``api_server``) and tensor-parallel
workers in spawned processes, so the plugin comes in with the interpreter: the package
installs ``portable_guided_lmdeploy.pth``, which imports the tiny
``portable_guided_lmdeploy_hook`` at start-up; that hook calls :func:`register` in any process
once lmdeploy's ``lmdeploy.pytorch.engine.logits_process`` has been imported (processes that
never import lmdeploy's engine never import portable_guided). Call :func:`register` yourself
where no ``.pth`` file runs (a ``PYTHONPATH`` checkout).

:func:`register` takes over:

- **apply** (default): ``GuidedDecodingManager.apply_batched_bitmap``, through which
  ``FusedLogitsProcessor`` and the speculative helper (``GuidedSpecHelper.apply_bitmask``,
  ``apply_serial_bitmask`` on strided views) mask logits, goes through
  :func:`portable_guided.apply_token_mask` on the logits' own device and dtype
  (:mod:`.apply`).
- **backend** (``PORTABLE_GUIDED_LMDEPLOY_BACKEND=1``): our
  :class:`~portable_guided.runtime.GrammarRuntime` behind ``GuidedDecodingManager``
  (:mod:`.backend`): compiles in worker processes under a hard limit, never on the event loop;
  a failing schema fails its request alone; a rejected token fails its request; a request's
  compile is submitted when the engine admits it (``Engine._add_message``); speculative
  verification fills each request's draft positions with ``Request.fill_draft_masks``.

Each takeover happens only when the source of every lmdeploy function it relies on matches a
verified lmdeploy build (:mod:`.guard`); an unknown build is left alone with one warning. The
first apply of each kind is compared with lmdeploy's own function (the canary).

Environment:

- ``PORTABLE_GUIDED_LMDEPLOY=0`` turns the plugin off (the hook then does nothing);
  ``force`` patches a build whose functions match no verified build (a loud warning; the
  canary still checks the first calls). Default ``1``: verified builds only.
- ``PORTABLE_GUIDED_LMDEPLOY_BACKEND=1``: the runtime backend (default ``0``). Its settings:
  ``PORTABLE_GUIDED_LMDEPLOY_ENGINE`` (``xgrammar``, ``llguidance`` or ``auto``; default
  ``auto``; ``xgrammar`` keeps masks equal to lmdeploy's own),
  ``PORTABLE_GUIDED_LMDEPLOY_COMPILE_TIMEOUT_S`` (default 30),
  ``PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS`` (default half the cores, at most 4),
  ``PORTABLE_GUIDED_LMDEPLOY_CACHE_DIR`` (on-disk compile cache shared by the engine's
  processes; default none; with the ``mp``/``ray`` executors it also lets the engine's
  process compile at admission for the ranks: :mod:`.prefetch`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ENV_BACKEND", "ENV_ENABLE", "TESTED_LMDEPLOY_VERSIONS", "is_patched", "register",
           "taken_over", "unpatch"]

#: Environment variable that turns the plugin off (``0``) or forces it (``force``).
ENV_ENABLE = "PORTABLE_GUIDED_LMDEPLOY"
#: Environment variable that also puts the grammar runtime behind ``GuidedDecodingManager``.
ENV_BACKEND = "PORTABLE_GUIDED_LMDEPLOY_BACKEND"
#: lmdeploy versions whose functions this plugin was verified against.
TESTED_LMDEPLOY_VERSIONS = ("0.18.0",)

_PROCESSOR = "lmdeploy.pytorch.engine.logits_process"

logger = logging.getLogger("lmdeploy.plugins.portable_guided")
_lock = threading.RLock()
#: (owner class, attribute) -> lmdeploy's own function, while ours is installed.
_originals: dict[tuple[Any, str], Callable[..., Any]] = {}
_taken: dict[str, str] = {}  # takeover -> build (or "forced")
_warned: set[str] = set()  # each refusal is warned about once per process


def _setting(name: str, default: str) -> str:
    return os.environ.get(name, default).strip().lower()


def register() -> None:
    """Take over lmdeploy's grammar path in this process (see the module docstring); safe
    to call more than once."""
    setting = _setting(ENV_ENABLE, "1")
    if setting in ("0", "false", "off", "no"):
        logger.info("portable_guided lmdeploy plugin disabled by %s=%s", ENV_ENABLE, setting)
        return
    import lmdeploy

    version = str(getattr(lmdeploy, "__version__", "unknown"))
    force = setting == "force"
    try:
        # Outside the lock: this import is what triggers the .pth hook's own register() in
        # a process that has not imported lmdeploy's engine yet (it must not wait on us).
        importlib.import_module(_PROCESSOR)
    except ImportError as exc:  # the guard then finds the functions missing, and says so
        logger.warning("portable_guided could not import %s: %s", _PROCESSOR, exc)
    with _lock:
        if "apply" not in _taken:
            _take_over("apply", version, force, _install_apply)
        if _setting(ENV_BACKEND, "0") in ("1", "true", "on", "yes") and "backend" not in _taken:
            _take_over("backend", version, force, _install_backend)


def is_patched() -> bool:
    """Whether ``GuidedDecodingManager.apply_batched_bitmap`` is ours in this process."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    return (GuidedDecodingManager, "apply_batched_bitmap") in _originals and getattr(
        GuidedDecodingManager.__dict__["apply_batched_bitmap"], "__wrapped__", None) is (
        _originals[(GuidedDecodingManager, "apply_batched_bitmap")])


def taken_over() -> dict[str, str]:
    """Takeover (``apply``, ``backend``) -> ``verified`` or ``forced``, in this process."""
    from .guard import FORCED

    return {name: "forced" if build == FORCED else "verified" for name, build in _taken.items()}


def unpatch() -> None:
    """Put lmdeploy's own functions back (tests compare on and off)."""
    with _lock:
        for name in list(_taken):
            _restore(name)


def _take_over(name: str, version: str, force: bool,
               install: Callable[[str, str], None]) -> None:
    from . import guard

    found = guard.current(version, _originals_by_name())
    if name in _taken:  # taken while the fingerprints' imports ran (the .pth hook)
        return
    build = guard.GUARD.match(found, name)
    if build is None and not force:
        why = guard.GUARD.mismatches(found, name)
        if f"{name}: {why}" not in _warned:
            _warned.add(f"{name}: {why}")
            logger.warning(
                "portable_guided leaves lmdeploy %s's grammar path unchanged (%s): %s "
                "(verified builds: %s; set %s=force to patch anyway)", version, name, why,
                ", ".join(guard.KNOWN), ENV_ENABLE)
        return
    if build is None:
        logger.warning(
            "%s=force: portable_guided takes over lmdeploy %s's %s although %s (verified: %s). "
            "Masks may be WRONG; the first calls of each kind are checked against lmdeploy's "
            "own function.", ENV_ENABLE, version, name, guard.GUARD.mismatches(found, name),
            ", ".join(guard.KNOWN))
        build = guard.FORCED
    install(name, build)
    _taken[name] = build
    logger.info("portable_guided takes over lmdeploy %s's %s (%s; pid %d)", version,
                {"apply": "grammar bitmask application",
                 "backend": "grammar compiles and matchers"}[name],
                "FORCED" if build == guard.FORCED else f"verified build {build}", os.getpid())


def _originals_by_name() -> dict[str, Any]:
    """lmdeploy's own functions by fingerprint name, for those we replaced already."""
    from . import guard

    out: dict[str, Any] = {}
    for name, (module, qualname) in guard.FUNCTIONS.items():
        owner_name, _, attr = qualname.rpartition(".")
        for (owner, owned), original in _originals.items():
            if owner.__module__ == module and owner.__qualname__ == owner_name and owned == attr:
                out[name] = original
    return out


def _replace(owner: Any, attr: str, ours: Callable[..., Any]) -> None:
    original = owner.__dict__[attr]
    wrapper = functools.wraps(original)(ours)
    _originals[(owner, attr)] = original
    setattr(owner, attr, wrapper)


def _put_back(owner: Any, attr: str) -> None:
    original = _originals.pop((owner, attr), None)
    if original is not None:
        setattr(owner, attr, original)


def _install_apply(name: str, build: str) -> None:
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    from . import apply, guard

    original = GuidedDecodingManager.__dict__["apply_batched_bitmap"]
    takeover = guard.Takeover(name=name, original=original, build=build)
    takeover.canary = guard.canary(name, lambda: _restore_from_canary("apply"))
    apply.TAKEOVER = takeover

    def apply_batched_bitmap(self: Any, logits: Any, guided_bitmask: Any) -> None:
        apply.apply_batched_bitmap(self, logits, guided_bitmask)

    _replace(GuidedDecodingManager, "apply_batched_bitmap", apply_batched_bitmap)


def _install_backend(name: str, build: str) -> None:
    from lmdeploy.pytorch.engine.engine import Engine
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    from . import backend

    for attr, ours in backend.manager_methods(GuidedDecodingManager.__dict__).items():
        _replace(GuidedDecodingManager, attr, ours)
    original_fill = FusedLogitsProcessor.__dict__["_fill_guided_bitmask"]
    _replace(FusedLogitsProcessor, "_fill_guided_bitmask",
             backend.batched_fill(original_fill))
    _replace(Engine, "_add_message", backend.admission(Engine.__dict__["_add_message"]))
    _replace(GuidedSpecHelper, "apply_serial_bitmask",
             backend.serial_bitmask(GuidedSpecHelper.__dict__["apply_serial_bitmask"]))


def _restore_from_canary(name: str) -> None:
    """The canary's restore, from inside an apply on any thread."""
    with _lock:
        _restore(name)


def _restore(name: str) -> None:
    """Put lmdeploy's functions of one takeover back; :data:`_lock` held."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    if _taken.pop(name, None) is None:
        return
    if name == "apply":
        from . import apply

        apply.TAKEOVER = None
        _put_back(GuidedDecodingManager, "apply_batched_bitmap")
        return
    from lmdeploy.pytorch.engine.engine import Engine
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    for owner, attr in list(_originals):
        if owner is GuidedDecodingManager and attr != "apply_batched_bitmap":
            _put_back(owner, attr)
    _put_back(FusedLogitsProcessor, "_fill_guided_bitmask")
    _put_back(Engine, "_add_message")
    _put_back(GuidedSpecHelper, "apply_serial_bitmask")
