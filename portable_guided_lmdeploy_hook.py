"""Activates portable_guided's lmdeploy plugin in every Python process of this environment.

lmdeploy has no plugin mechanism, and its ``api_server`` runs the engine in a spawned
process (tensor-parallel workers are spawned too, or run under Ray), so the plugin has to come
in with the interpreter: ``portable_guided_lmdeploy.pth``, installed with the package, imports
this module at start-up. It costs one small import and touches nothing else: it watches for
``lmdeploy.pytorch.engine.logits_process`` (which the engine's model agent imports, and which
imports ``GuidedDecodingManager``) and, once that module has run, calls
:func:`portable_guided.integrations.lmdeploy.register`. Processes that never import lmdeploy's
PyTorch engine never import portable_guided.

``PORTABLE_GUIDED_LMDEPLOY=0`` (or ``false``, ``off``, ``no``) turns it off.
"""

from __future__ import annotations

# No other import here (not even typing): this module runs at every interpreter start-up.
import os
import sys

__all__ = ["ENV_ENABLE", "TRIGGER", "activate", "install"]

#: The environment variable that turns the plugin off (``0``).
ENV_ENABLE = "PORTABLE_GUIDED_LMDEPLOY"
#: The lmdeploy module whose import activates the plugin.
TRIGGER = "lmdeploy.pytorch.engine.logits_process"


def _enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "1").strip().lower() not in ("0", "false", "off", "no")


def activate() -> None:
    """Register the plugin; an error is logged, never raised into lmdeploy's import."""
    if not _enabled():
        return
    try:
        from portable_guided.integrations.lmdeploy import register

        register()
    except Exception:  # lmdeploy must run without us rather than fail
        import logging

        logging.getLogger("lmdeploy.plugins.portable_guided").exception(
            "portable_guided could not activate its lmdeploy plugin; lmdeploy runs unchanged")


class _Loader:
    """Runs the trigger module with its own loader, then :func:`activate`."""

    def __init__(self, loader: object) -> None:
        self.loader = loader

    def create_module(self, spec: object) -> object:
        return self.loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        self.loader.exec_module(module)
        activate()

    def __getattr__(self, name: str) -> object:  # get_source, get_code, is_package...
        return getattr(self.loader, name)


class _Finder:
    """A ``sys.meta_path`` entry that answers for :data:`TRIGGER` only, once."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != TRIGGER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the watcher on ``sys.meta_path`` (once), unless turned off; if the trigger module
    is already imported, activate now."""
    if not _enabled() or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    if TRIGGER in sys.modules:
        activate()
        return
    sys.meta_path.insert(0, _Finder())


install()
