"""The grammar-engine strategy interface.

An :class:`Engine` compiles specs for one tokenizer and fills bitmasks for many matchers at
once; a :class:`Matcher` is one request's position in a compiled grammar. Both engines write
the same int32 bitmask layout (bit j of word k set = token 32k+j allowed), so everything
downstream is engine-agnostic.

Each engine also owns the conversion of a :class:`~portable_guided.runtime.TokenizerInfo`
into its library's tokenizer object (:meth:`Engine.create`), and the picklable payload from
which a compile worker process rebuilds it (:meth:`Engine.tokenizer_payload`,
:meth:`Engine.from_payload`).
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from ...json_schema.errors import EmptyLanguage
from ..specs import GrammarSpec

if TYPE_CHECKING:
    from ..tokenizer_info import TokenizerInfo

__all__ = [
    "EmptyLanguage",
    "Engine",
    "Matcher",
    "UnsupportedSpec",
    "compile_checked",
    "first_line",
    "foreign_matcher",
    "package_version",
]


@functools.cache
def package_version(distribution: str, module: str | None = None) -> str:
    """The installed version of ``distribution`` from its package metadata (part of the disk
    cache key; xgrammar 0.2.8 has no ``__version__``), else the module's ``__version__``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        mod = importlib.import_module(module or distribution)
        found = getattr(mod, "__version__", None)
        if found is None:
            raise RuntimeError(f"cannot tell the version of {distribution}: no package "
                               "metadata and no __version__") from None
        return str(found)


def foreign_matcher(engine: str, matcher: object) -> NoReturn:
    """Raise the TypeError for a matcher that ``engine`` did not make (a batch fill reads
    each matcher's library object, which only the engine's own matcher class holds)."""
    raise TypeError(f"the {engine} engine cannot fill a {type(matcher).__name__}: a matcher "
                    "made by another engine was passed to its fill_batch")


class UnsupportedSpec(Exception):
    """The engine cannot express this kind of spec (``auto`` then tries the other engine)."""


def first_line(text: str, limit: int = 300) -> str:
    """The first line of an engine's diagnosis (llguidance appends a dump of its state)."""
    return text.strip().split("\n", 1)[0][:limit]


def compile_checked(engine: Engine, spec: GrammarSpec) -> Any:
    """``engine.compile(spec)``, refusing a grammar whose language is empty (the compile
    job's entry point, in this process and in compile workers)."""
    spec.run_deferred_check()
    compiled = engine.compile(spec)
    engine.check_not_empty(compiled)
    return compiled


class Matcher(ABC):
    """One request's state in a compiled grammar. Not thread-safe by itself: the
    :class:`~portable_guided.runtime.request.Request` that owns it serializes access."""

    __slots__ = ()

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``; on False the state is unchanged."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""

    @abstractmethod
    def fill(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]``."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted."""

    @abstractmethod
    def jump_forward(self) -> str:
        """The text the grammar forces next (may be empty)."""

    def error(self) -> str | None:
        """The engine's error when the matcher is in an error state it cannot leave (the
        request must then fail), else None."""
        return None


class Engine(ABC):
    """A grammar engine bound to one tokenizer."""

    #: Registry name (``"xgrammar"`` or ``"llguidance"``).
    name: str = ""
    #: Whether ``Matcher.fill`` releases the GIL, so the runtime's own threads can fill rows
    #: (timed one by one and ordered longest first); otherwise batches go to :meth:`fill_batch`.
    fill_releases_gil: bool = False
    #: Whether a matcher can enter an error state it cannot leave (``Matcher.error``), so a
    #: batch fill asks each of its matchers after filling.
    matcher_errors: bool = False
    #: Columns of the model's vocabulary (bitmask rows cover them).
    vocab_size: int = 0
    #: The tokens that end a finished grammar.
    stop_token_ids: frozenset[int] = frozenset()

    @staticmethod
    @abstractmethod
    def version() -> str:
        """The engine library's version (part of the on-disk cache key)."""

    @classmethod
    @abstractmethod
    def create(cls, info: TokenizerInfo, *, fill_threads: int = 1) -> Engine:
        """The engine for tokenizer ``info`` in this process (the library's tokenizer object
        is built once per ``info`` and kept in its :meth:`~TokenizerInfo.cached` store)."""

    @staticmethod
    @abstractmethod
    def tokenizer_payload(info: TokenizerInfo) -> Any:
        """A picklable description of ``info``'s tokenizer, sent to compile workers."""

    @classmethod
    @abstractmethod
    def from_payload(cls, payload: Any, *, fill_threads: int = 1) -> Engine:
        """Rebuild the engine in a worker process from :meth:`tokenizer_payload`'s result."""

    @abstractmethod
    def compile(self, spec: GrammarSpec) -> Any:
        """Compile ``spec`` in this thread; raises on an invalid grammar."""

    def compile_raw(self, spec: GrammarSpec) -> Any:
        """The library's own compile of a ``json_schema`` spec on the user's schema text,
        called as vLLM calls it: no lowering, no refusals, no empty-language check. For
        baselines (``bench maskbench --raw``), never for serving."""
        raise UnsupportedSpec(f"{type(self).__name__} has no raw JSON-schema compile")

    @abstractmethod
    def serialize(self, compiled: Any) -> str:
        """A text form of ``compiled`` that :meth:`deserialize` reads back."""

    @abstractmethod
    def deserialize(self, text: str) -> Any:
        """Inverse of :meth:`serialize`."""

    @abstractmethod
    def nbytes(self, compiled: Any) -> int:
        """Approximate memory held by ``compiled`` (for the byte-bounded cache)."""

    @abstractmethod
    def new_matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of ``compiled``."""

    def forget(self, compiled: Any) -> None:
        """Drop every copy of ``compiled`` the engine library keeps, so that compiling its
        spec again builds it anew (the runtime discards a grammar an engine failed on).
        Engines whose library keeps no compiled grammars do nothing."""

    def check_not_empty(self, compiled: Any) -> None:
        """Raise :class:`EmptyLanguage` when ``compiled`` accepts no output: its first mask
        allows no token, or only stop tokens that it does not accept (a grammar accepting
        the empty output accepts a stop token at once)."""
        import numpy as np

        bitmask = np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.int32)
        matcher = self.new_matcher(compiled)
        matcher.fill(bitmask, 0)
        bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
        allowed = np.flatnonzero(bits).tolist()
        if set(allowed) <= self.stop_token_ids and not any(
                self.new_matcher(compiled).accept(t) for t in allowed):
            raise EmptyLanguage(
                "the grammar accepts no output at all (its language is empty, e.g. a schema "
                "that only refers to itself): a request could produce nothing")
        problem = matcher.error()
        if problem is not None:
            raise ValueError(f"the engine failed on the first mask: {first_line(problem)}")

    @abstractmethod
    def fill_batch(self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]) -> None:
        """Fill ``bitmask[rows[i]]`` from ``matchers[i]``, using the engine's threads."""

    def fill_chunk(self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]) -> None:
        """Fill ``bitmask[rows[i]]`` from ``matchers[i]`` on one thread, in one call into the
        library where it has one (no Python per row, the GIL released once): for steps too
        cheap to share between threads. The default fills row by row."""
        for matcher, row in zip(matchers, rows):
            matcher.fill(bitmask, row)
