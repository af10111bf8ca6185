"""The one guard every engine plugin uses: fingerprints before patching, a canary after.

An engine plugin replaces a few of the serving engine's functions with ours. Two things keep
a wrong mask from ever reaching the logits, and both are engine-neutral, so they live here
and each plugin's ``guard.py`` holds only its data (which functions, the fingerprints of
every verified build) and the glue that describes a call:

**Fingerprints.** :func:`fingerprint` hashes a function's source. An :class:`EngineGuard`
names the engine functions each takeover relies on and the fingerprints of every build the
plugin was verified against; :meth:`EngineGuard.match` says which verified build the
installed engine is, per takeover, and :meth:`EngineGuard.mismatches` why none is.

**Canary.** :class:`Canary` runs the engine's own function on a copy of the logits on the
first call of each kind and compares exactly with ours. On any difference: an error in the
log, the engine's logits for that batch and the engine's function back for the rest of the
process. When the engine's own function raises, that is the engine's behaviour: the canary
restores it and lets the error through, so the plugin is out of the way from then on.

>>> import hashlib
>>> fingerprint_source("def f():\\n    return 1\\n") == hashlib.sha256(
...     b"def f():\\n    return 1").hexdigest()[:16]
True
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import textwrap
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORCED", "NO_SOURCE", "Canary", "EngineGuard", "Fingerprints", "Takeover",
           "describe_difference", "fingerprint", "fingerprint_source", "resolve", "same"]

#: :attr:`Takeover.build` of a takeover that matched no verified build (``...=force``).
FORCED = "forced"
#: :attr:`Fingerprints.values` of a function whose source cannot be read (compiled, or built at
#: run time): never equal to a fingerprint, so such a function never matches.
NO_SOURCE = "no-source"


def fingerprint_source(source: str) -> str:
    """SHA-256 (first 16 hex digits) of a function's source text, dedented and with leading
    decorator lines dropped (so a decorated function and its undecorated twin hash the same).

    >>> fingerprint_source("    @jit\\n    def f(x):\\n        return x\\n") == (
    ...     fingerprint_source("def f(x):\\n    return x"))
    True
    """
    lines = textwrap.dedent(source).splitlines()
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def fingerprint(obj: Any) -> str:
    """:func:`fingerprint_source` of a function's source. A Triton ``JITFunction`` is hashed
    as the Python function it wraps (``fn``), so it and its undecorated placeholder (vLLM's,
    without Triton) hash the same. Raises ``OSError`` or ``TypeError`` without source."""
    obj = getattr(obj, "fn", obj)
    return fingerprint_source(inspect.getsource(obj))


def resolve(module_name: str, qualname: str) -> Any:
    """The function ``qualname`` of ``module_name``, or None if either is missing.

    A class attribute is read through the class ``__dict__`` where it is defined there, so a
    ``staticmethod`` or ``classmethod`` gives its function and a ``property`` its getter (what
    the engine runs, and what has source)."""
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in qualname.split("."):
        raw = obj.__dict__.get(part) if inspect.isclass(obj) else None
        obj = raw if raw is not None else getattr(obj, part, None)
        if obj is None:
            return None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
    return obj


def same(a: Any, b: Any) -> bool:
    """Exact equality of two logits tensors, NaN equal to NaN."""
    import torch

    return bool(torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0)))


def describe_difference(ours: Any, theirs: Any, whose: str) -> str:
    """How two logits tensors that should be identical differ (NaN equals NaN)."""
    differ = (ours != theirs) & ~(ours.isnan() & theirs.isnan())
    rows = differ.any(dim=-1).nonzero().flatten().tolist() if differ.dim() > 1 else []
    return f"differs from {whose} on {int(differ.sum())} logits (rows {rows[:16]})"


@dataclass(frozen=True)
class Fingerprints:
    """The fingerprints of one installed engine; ``None`` for functions it lacks."""

    version: str
    values: dict[str, str | None] = field(default_factory=dict)


def _base(version: str) -> str:
    """A version without its local label (``0.32.0+cpu`` -> ``0.32.0``)."""
    return version.split("+")[0]


@dataclass(frozen=True)
class EngineGuard:
    """One engine's verified builds and how its canary speaks.

    ``functions``: fingerprint name -> (module, qualified name) of an engine function.
    ``takeovers``: takeover name (a runner, a hook) -> the fingerprint names it relies on.
    ``known``: verified build -> fingerprint per name; ``None`` for a function that build
    does not have (then the installed engine must lack it too). Held by reference, so the
    plugin's table (and a test's change to it) is what is matched.
    ``subject``: what a takeover replaces, for the canary's error (``grammar bitmask``).
    ``describe``: the kinds of one call, in words, for the canary's error.

    >>> guard = EngineGuard("Engine", logging.getLogger("demo"), {"f": ("m", "f")},
    ...                     {"hook": ("f",)}, {"1.0": {"f": "abc"}}, "apply")
    >>> guard.match(Fingerprints("1.0+local", {"f": "abc"}), "hook")
    '1.0'
    >>> guard.mismatches(Fingerprints("1.1", {"f": "abc"}), "hook")
    'Engine 1.1 is not a verified build'
    """

    engine: str
    logger: logging.Logger
    functions: Mapping[str, tuple[str, str]]
    takeovers: Mapping[str, tuple[str, ...]]
    known: Mapping[str, Mapping[str, str | None]]
    subject: str
    describe: Callable[[frozenset[Hashable]], str] = repr

    def current(self, version: str, originals: Mapping[str, Any] | None = None) -> Fingerprints:
        """Fingerprints of the installed engine (``version``). ``originals`` overrides a
        function by name (the engine's own, when ours is installed already)."""
        values: dict[str, str | None] = {}
        for name, (module_name, qualname) in self.functions.items():
            obj = (originals or {}).get(name) or resolve(module_name, qualname)
            obj = getattr(obj, "__wrapped__", obj)  # a functools.wraps decorator's original
            try:
                values[name] = None if obj is None else fingerprint(obj)
            except (OSError, TypeError):  # no source (compiled, or built at run time)
                values[name] = NO_SOURCE
        return Fingerprints(version, values)

    def _builds(self, version: str) -> list[str]:
        return [build for build in self.known if _base(build) == _base(version)]

    def match(self, found: Fingerprints, takeover: str) -> str | None:
        """The verified build of ``found``'s version whose fingerprints every function of
        ``takeover`` matches, or None (an unknown version never matches)."""
        names = self._names(takeover)
        for build in self._builds(found.version):
            known = self.known[build]
            if all(n in known and found.values.get(n) == known[n] for n in names):
                return build
        return None

    def mismatches(self, found: Fingerprints, takeover: str) -> str:
        """Why ``takeover`` matches no verified build, for the warning: the engine's
        functions by module and name, then the fingerprint names (as in ``known``)."""
        builds = self._builds(found.version)
        if not builds:
            return f"{self.engine} {found.version} is not a verified build"
        known = self.known[builds[0]]
        differ = [n for n in self._names(takeover)
                  if n not in known or found.values.get(n) != known[n]]
        named = ", ".join(f"{self.functions[n][0]}.{self.functions[n][1]}" for n in differ)
        return (f"the source of {named} differs from the verified {builds[0]} "
                f"({', '.join(differ)})")

    def _names(self, takeover: str) -> tuple[str, ...]:
        names = self.takeovers.get(takeover)
        if names is None:
            raise KeyError(f"{self.engine} has no takeover {takeover!r}; known: "
                           f"{', '.join(self.takeovers)}")
        return names


class Canary:
    """Compares one takeover with the engine's own function on the first call of each kind.

    A call brings one or more hashable *kinds* (vLLM's ``first``, ``speculative``; SGLang's
    device, dtype and rank); a call is checked when it brings a kind not seen yet. ``restore``
    puts the engine's function back (called once, on the first difference).
    """

    def __init__(self, guard: EngineGuard, name: str, restore: Callable[[], None]) -> None:
        self.guard = guard
        self.name = name
        self.restore = restore
        self.seen: set[Hashable] = set()
        self.tripped = False
        self.checks = 0
        self._lock = threading.Lock()

    def due(self, kinds: Iterable[Hashable]) -> bool:
        """Whether this call brings a kind not checked yet (host metadata only)."""
        return not self.tripped and not self.seen.issuperset(kinds)

    def check(
        self,
        logits: Any,
        kinds: Iterable[Hashable],
        ours: Callable[[Any], None],
        theirs: Callable[[Any], None],
    ) -> bool:
        """Run ``theirs`` on a copy and ``ours`` on ``logits``; on a difference keep the
        engine's logits, restore the engine's function and return False. An exception from
        ``theirs`` is the engine's own behaviour: it propagates, with the engine's function
        back (so the same input then fails the same way without us)."""
        kinds = frozenset(kinds)
        with self._lock:
            reference = logits.clone()
            # Seen before ``theirs`` runs: a kind whose reference raised is not checked again.
            self.seen |= kinds
            self.checks += 1
            try:
                theirs(reference)
            except Exception:
                self._trip(f"was not compared: {self.guard.engine}'s own function raised on "
                           "this input (its error follows)", kinds)
                raise
            try:
                ours(logits)
            except Exception as exc:  # noqa: BLE001 - ours failing is a difference too
                what = f"raised {type(exc).__name__}: {exc}"
            else:
                if same(logits, reference):
                    return True
                what = describe_difference(logits, reference, f"{self.guard.engine}'s")
            logits.copy_(reference)
            self._trip(what, kinds)
            return False

    def _trip(self, what: str, kinds: frozenset[Hashable]) -> None:
        engine = self.guard.engine
        self.guard.logger.error(
            "portable_guided's %s %s %s (%s): %s's result is used for this batch and %s's own "
            "function is restored for the rest of this process. Please report this with your "
            "%s version.", self.name, self.guard.subject, what, self.guard.describe(kinds),
            engine, engine, engine)
        self.tripped = True
        self.restore()


@dataclass(kw_only=True)
class Takeover:
    """One engine function replaced by ours: its name (a runner, a hook), the engine's
    original, the verified build it matched (:data:`FORCED` when none) and its canary.
    Plugins subclass it for their own facts (vLLM's layout, SGLang's patch target)."""

    name: str
    original: Callable[..., Any]
    build: str
    canary: Canary | None = None

    @property
    def forced(self) -> bool:
        """Whether this takeover matched no verified build (installed by ``force``)."""
        return self.build == FORCED
